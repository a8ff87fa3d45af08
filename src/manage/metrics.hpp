// kvt_metrics_text's numbers, gathered from a manager and its connector, as Prometheus text
// (src/observe/metrics.cpp formats them).
#pragma once

#include <string>

#include "kvtier.h"

namespace kvt {
class Manager;
namespace conn {
class Connector;
}

namespace manage {

// c: NULL, or a connector of mgr (the caller checks). The error set on failure.
kvt_status metrics_text(std::string *out, Manager &mgr, conn::Connector *c);

}  // namespace manage
}  // namespace kvt
