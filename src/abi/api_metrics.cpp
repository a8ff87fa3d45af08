// kvt_metrics_text: the numbers of every layer, as Prometheus text (src/manage/metrics.cpp).
#include <cstring>
#include <string>

#include "abi/connector_object.hpp"
#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "manage/metrics.hpp"

using namespace kvt;
using namespace kvt::abi;

extern "C" {

KVT_API kvt_status kvt_metrics_text(char *buf, size_t cap, size_t *len, kvt_manager *m,
                                    kvt_connector *c) {
  static constexpr const char *fn = "kvt_metrics_text";
  if (len == nullptr) return null_arg(fn, "len");
  if (kvt_status s = check_array(fn, "buf", buf, cap); s != KVT_OK) return s;
  return on_manager(fn, m, [&](Manager &mgr) {
    conn::Connector *conn = nullptr;
    if (c != nullptr) {
      kvt_status s;
      if ((conn = connector(fn, c, &s)) == nullptr) return s;
      if (&conn->manager() != &mgr)
        return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the connector belongs to another manager",
                    fn);
    }
    std::string text;
    if (kvt_status s = manage::metrics_text(&text, mgr, conn); s != KVT_OK) return s;
    *len = text.size();
    if (buf == nullptr && cap == 0) return KVT_OK;  // a query of the length
    if (cap < text.size() + 1)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the text needs %zu bytes and a NUL; cap is %zu",
                  fn, text.size(), cap);
    std::memcpy(buf, text.c_str(), text.size() + 1);
    return KVT_OK;
  });
}

}  // extern "C"
