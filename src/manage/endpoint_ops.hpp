// The management protocol's requests (docs/EVENTS.md, "The management endpoint"), answered
// from a manager and its connector: what observe/endpoint's server calls for each line.
#pragma once

#include "kvtier.h"
#include "observe/endpoint.hpp"

namespace kvt {
class Manager;
namespace conn {
class Connector;
}

namespace manage {

kvt_endpoint_config endpoint_defaults() noexcept;
kvt_status validate_endpoint(const kvt_endpoint_config &c, const char *fn);
obs::EndpointLimits endpoint_limits(const kvt_endpoint_config &c) noexcept;
// c: NULL (the connector's requests then answer that there is none), or a connector of mgr.
// Both must outlive the endpoint.
obs::EndpointOps endpoint_ops(Manager &mgr, conn::Connector *c);

}  // namespace manage
}  // namespace kvt
