// kvtier-replay's settings, as parsed from its command line.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier.h"

namespace kvt::replay {

enum class Offload { Eager, Lazy };
// blocks: block calls per request (kvtier's own G1); engine: a continuous-batching engine
// that owns G1 and reaches G2/G3 only through the connector.
enum class Mode { Blocks, Engine };

struct Options {
  std::string trace;
  Mode mode = Mode::Blocks;
  uint32_t page_size = 512;
  uint64_t g1_blocks = 4000, g2_blocks = 20000, g3_blocks = 60000;
  uint32_t layers = 1, outer = 2;
  uint64_t chunk_bytes = 16384;
  uint32_t concurrency = 1;
  Offload offload = Offload::Eager;
  uint32_t min_frequency = 0;  // 0: presence policy; N: frequency N (with presence)
  int eviction[3] = {-1, -1, -1};  // kvt_eviction of G1, G2, G3; -1: the library's default
  std::string g3_path;         // empty: a temporary directory
  bool g3_keep = false;        // G3's file persists in g3_path and is reused (g3_persist)
  std::string g4_url;          // --g4: G4 on Redis (blocks mode); empty: no G4
  std::string g4_key_env;      // --g4-key-env: the variable holding G4's key; empty: none
  bool json = false;
  std::string record;          // --record: the run's event log (docs/EVENTS.md)
  bool verify_record = false;  // --verify-record: replay it into a fresh manager and compare
  std::string console_socket;  // --console-socket: the management endpoint (kvtier-console)
  uint16_t metrics_port = 0;   // --metrics-port: serve /metrics on 127.0.0.1 (0: off)
  std::string dump_registry;   // --dump-registry: each tier's hashes at the end, as JSON
  double kv_events_hold_s = 0; // the manager (and its KV-event sockets) stay up this long
  std::string kv_events, kv_events_replay, kv_events_topic;  // empty: no KV events
  uint64_t kv_events_buffer = 0;  // batches kept for replay; 0: the library's default
  uint32_t shard_index = 0, shard_count = 1;  // --shard I/N: conversations I mod N
  std::string timeline_csv, plot_svg;
  double interval_s = 60;      // timeline bucket width in trace time
  bool progress = true;        // a progress bar, when stderr is a terminal
  bool prefault = true;        // touch every page of G1 and G2 before the replay
  bool g1_cuda = false;        // --g1-memory cuda: G1 in CUDA device memory
  int cuda_copy = -1;          // --cuda-copy: kvt_cuda_copy; -1: the library's default
  uint32_t token_budget = 2048;  // engine: tokens computed per step, over all requests
  uint32_t max_running = 64;     // engine: requests running at once
  uint32_t layer_forward_us = 0;  // engine: busy time of each layer's simulated forward
  bool compare_bare = false;      // engine: the run's forwards again without the connector

  uint64_t block_bytes() const { return uint64_t(layers) * outer * chunk_bytes; }
};

// The manager's KV-event fields from --kv-events*; the strings stay o's.
inline void set_kv_events(kvt_manager_config *c, const Options &o) {
  if (o.kv_events.empty()) return;
  c->kv_events_endpoint = o.kv_events.c_str();
  if (!o.kv_events_replay.empty()) c->kv_events_replay_endpoint = o.kv_events_replay.c_str();
  c->kv_events_topic = o.kv_events_topic.c_str();
  if (o.kv_events_buffer) c->kv_events_buffer = o.kv_events_buffer;
}

}  // namespace kvt::replay
