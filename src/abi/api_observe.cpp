// Observe: subscriptions, the recorder and event logs.
#include <cstring>
#include <string>

#include "abi/connector_object.hpp"
#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "common/versioned.hpp"
#include "connector/log_replay.hpp"
#include "connector/log_rerun.hpp"
#include "observe/bus.hpp"
#include "observe/event_json.hpp"
#include "observe/log_file.hpp"
#include "observe/subscriber.hpp"

struct kvt_subscription {
  static constexpr uint64_t kMagic = 0x6b76747375627363;  // "kvtsubsc"
  uint64_t magic = kMagic;
  std::weak_ptr<kvt::obs::Bus> bus;
  std::shared_ptr<kvt::obs::Subscriber> sub;
};

struct kvt_event_log {
  static constexpr uint64_t kMagic = 0x6b767465766c6f67;  // "kvtevlog"
  uint64_t magic = kMagic;
  kvt::obs::LogReader reader;
};

using namespace kvt;
using namespace kvt::abi;

namespace {

// What replay and rerun share: their arguments checked, then open(feed), which checks its
// own and calls feed(apply, finish): the log at path goes through apply(event, call
// arguments), then finish(&counts, &first) reports.
template <class Open>
kvt_status feed_log(const char *fn, kvt_log_replay *out, const char *path, Open &&open) {
  if (out == nullptr) return null_arg(fn, "out");
  if (path == nullptr) return null_arg(fn, "path");
  return guard(fn, [&] {
    if (kvt_status s = check_struct_size<kvt_log_replay>(fn, "out", out->struct_size);
        s != KVT_OK)
      return s;
    return open([&](auto &&apply, auto &&finish) {
      obs::LogReader reader;
      if (kvt_status st = reader.open(path); st != KVT_OK)
        return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
      kvt_obs_event e;
      std::string args;
      kvt_status st;
      while ((st = reader.next(&e, &args)) == KVT_OK) apply(e, args);
      if (st == KVT_ERR_IO) return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
      kvt_log_replay r{};
      r.torn = st == KVT_ERR_CORRUPT;
      std::string first;
      finish(&r, &first);
      write_versioned(out, r);
      if (r.violations) return fail(KVT_ERR_CORRUPT, "%s: %s", fn, first.c_str());
      return KVT_OK;
    });
  });
}

constexpr size_t kMaxEvents = size_t{1} << 24;

template <class T>
T *live(const char *fn, T *p, const char *type, kvt_status *st) noexcept {
  if (p == nullptr || p->magic != T::kMagic) {
    *st = bad_object(fn, p, type);
    return nullptr;
  }
  *st = KVT_OK;
  return p;
}

}  // namespace

extern "C" {

KVT_API kvt_status kvt_subscription_create(kvt_subscription **out, kvt_manager *m,
                                           size_t capacity) {
  static constexpr const char *fn = "kvt_subscription_create";
  if (out == nullptr) return null_arg(fn, "out");
  return on_manager(fn, m, [&](Manager &mgr) {
    if (capacity == 0 || capacity > kMaxEvents)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: capacity %zu is not in 1..%zu", fn, capacity,
                  kMaxEvents);
    auto s = std::make_unique<kvt_subscription>();
    s->bus = mgr.bus_ptr();
    s->sub = std::make_shared<obs::Subscriber>(capacity);
    mgr.bus().subscribe(s->sub);
    *out = s.release();
    return KVT_OK;
  });
}

KVT_API int kvt_subscription_fd(kvt_subscription *s) {
  kvt_status st;
  return live("kvt_subscription_fd", s, "subscription", &st) ? s->sub->fd() : -1;
}

KVT_API size_t kvt_subscription_drain(kvt_subscription *s, kvt_obs_event *out, size_t max) {
  static constexpr const char *fn = "kvt_subscription_drain";
  kvt_status st;
  if (live(fn, s, "subscription", &st) == nullptr) return 0;
  if (out == nullptr && max > 0) {
    null_arg(fn, "out");
    return 0;
  }
  return s->sub->drain(out, max);
}

KVT_API void kvt_subscription_destroy(kvt_subscription *s) {
  kvt_status st;
  if (s == nullptr || live("kvt_subscription_destroy", s, "subscription", &st) == nullptr) return;
  if (auto bus = s->bus.lock()) bus->unsubscribe(s->sub.get());
  s->magic = 0;
  delete s;
}

KVT_API kvt_status kvt_manager_recorder_ring(kvt_manager *m, size_t events) {
  static constexpr const char *fn = "kvt_manager_recorder_ring";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (events > kMaxEvents)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: %zu events is more than %zu", fn, events,
                  kMaxEvents);
    return mgr.bus().set_ring(events);
  });
}

KVT_API kvt_status kvt_manager_recorder_dump(kvt_manager *m, const char *path) {
  static constexpr const char *fn = "kvt_manager_recorder_dump";
  if (path == nullptr) return null_arg(fn, "path");
  return on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status st = mgr.bus().dump_ring(path); st != KVT_OK)
      return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_manager_recorder_open(kvt_manager *m, const char *path) {
  static constexpr const char *fn = "kvt_manager_recorder_open";
  if (path == nullptr) return null_arg(fn, "path");
  return on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status st = mgr.bus().open_log(path); st != KVT_OK)
      return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_manager_recorder_close(kvt_manager *m) {
  static constexpr const char *fn = "kvt_manager_recorder_close";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status st = mgr.bus().close_log(); st != KVT_OK)
      return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_event_log_open(kvt_event_log **out, const char *path) {
  static constexpr const char *fn = "kvt_event_log_open";
  if (out == nullptr) return null_arg(fn, "out");
  if (path == nullptr) return null_arg(fn, "path");
  return guard(fn, [&] {
    auto l = std::make_unique<kvt_event_log>();
    if (kvt_status st = l->reader.open(path); st != KVT_OK)
      return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    *out = l.release();
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_event_log_read(kvt_obs_event *out, kvt_event_log *l) {
  static constexpr const char *fn = "kvt_event_log_read";
  if (out == nullptr) return null_arg(fn, "out");
  return guard(fn, [&] {
    kvt_status st;
    if (live(fn, l, "event log", &st) == nullptr) return st;
    if (st = l->reader.next(out); st == KVT_ERR_NOT_FOUND) return KVT_ITEROVER;
    if (st != KVT_OK) return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    return st;
  });
}

KVT_API void kvt_event_log_close(kvt_event_log *l) {
  kvt_status st;
  if (l == nullptr || live("kvt_event_log_close", l, "event log", &st) == nullptr) return;
  l->magic = 0;
  delete l;
}

KVT_API kvt_status kvt_event_log_replay(kvt_log_replay *out, kvt_manager *m, const char *path) {
  static constexpr const char *fn = "kvt_event_log_replay";
  return feed_log(fn, out, path, [&](auto &&feed) {
    Manager *fresh = nullptr;
    kvt_status st;
    if (m != nullptr && (fresh = manager(fn, m, &st)) == nullptr) return st;
    conn::LogReplay replay(fresh);
    return feed([&](const kvt_obs_event &e, const std::string &) { replay.apply(e); },
                [&](kvt_log_replay *r, std::string *first) { replay.result(r, first); });
  });
}

KVT_API kvt_status kvt_event_log_rerun(kvt_log_replay *out, kvt_connector *c, const char *path) {
  static constexpr const char *fn = "kvt_event_log_rerun";
  return feed_log(fn, out, path, [&](auto &&feed) {
    kvt_status st;
    conn::Connector *conn = connector(fn, c, &st);
    if (conn == nullptr) return st;
    return conn->with_scheduler(fn, [&](conn::Scheduler &s) {
      conn::LogRerun rerun(s, conn->manager());
      return feed([&](const kvt_obs_event &e, const std::string &args) { rerun.apply(e, args); },
                  [&](kvt_log_replay *r, std::string *first) { rerun.finish(r, first); });
    });
  });
}

KVT_API const char *kvt_obs_kind_str(uint32_t kind) { return obs_kind_name(kind); }
KVT_API const char *kvt_candidate_state_str(uint32_t state) { return candidate_name(state); }
KVT_API const char *kvt_obs_trigger_str(uint32_t trigger) { return trigger_name(trigger); }

KVT_API kvt_status kvt_obs_event_json(char *buf, size_t cap, size_t *len,
                                      const kvt_obs_event *e) {
  static constexpr const char *fn = "kvt_obs_event_json";
  if (len == nullptr) return null_arg(fn, "len");
  if (e == nullptr) return null_arg(fn, "e");
  if (kvt_status s = check_array(fn, "buf", buf, cap); s != KVT_OK) return s;
  return guard(fn, [&] {
    const std::string text = obs::event_json_text(*e);
    *len = text.size();
    if (buf == nullptr) return KVT_OK;
    if (cap < text.size() + 1)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the text needs %zu bytes and a NUL; cap is %zu",
                  fn, text.size(), cap);
    std::memcpy(buf, text.c_str(), text.size() + 1);
    return KVT_OK;
  });
}

}  // extern "C"
