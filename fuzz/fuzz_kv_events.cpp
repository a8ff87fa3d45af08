// fuzz_kv_events: arbitrary bytes as the payload of a KV-event message, through
// kvtier-router's decoder (tools/router/event_decoder.cpp, compiled into this binary) and
// index. A refusal has a reason; whatever decodes, decodes the same again, and each of its
// events leaves the index as the event says.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "event_decoder.hpp"
#include "index.hpp"

using namespace kvt::router;

static void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_kv_events: %s\n", what);
  std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Batch b;
  std::string error;
  if (!decode_batch(data, size, &b, &error)) {
    check(!error.empty(), "a refusal without a reason");
    return 0;
  }
  Batch again;
  check(decode_batch(data, size, &again, &error), "decodes once, not twice");
  check(again.events.size() == b.events.size(), "decodes to another batch");
  Index ix;
  size_t inst = ix.add_instance();
  for (const Event &e : b.events) {
    Batch one;
    one.events.push_back(e);
    ix.apply(inst, one);
    // The event's medium by name: a medium of None is the one named "" (nullopt would ask
    // for any medium).
    const std::optional<std::string> m = e.medium ? *e.medium : std::string();
    switch (e.kind) {
      case EventKind::Stored:
        for (uint64_t h : e.hashes) check(ix.prefix(inst, &h, 1, m) == 1, "stored, not held");
        break;
      case EventKind::Removed:
        // A 33rd medium shares a bit with the 32nd: only known media are checked.
        if (ix.media().size() < Index::kMaxMedia)
          for (uint64_t h : e.hashes) check(ix.prefix(inst, &h, 1, m) == 0, "removed, held");
        break;
      case EventKind::Cleared:
        check(ix.blocks(inst) == 0, "cleared, blocks remain");
        break;
    }
  }
  return 0;
}
