// kvtier-replay: what tiering does for a recorded serving trace, and how fast kvtier does it.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine_sim.hpp"
#include "g1_bytes.hpp"
#include "kvtier.h"
#include "options.hpp"
#include "registry_dump.hpp"
#include "replayer.hpp"
#include "report.hpp"
#include "trace.hpp"

using namespace kvt::replay;

namespace {

int usage_error(const std::string &why) {
  std::fprintf(stderr, "kvtier-replay: %s\n", why.c_str());
  return 2;
}

// A count from the command line: kept signed while parsing, so that "-5" is reported as a
// negative count rather than wrapped or refused with a generic message.
bool in_range(const char *name, long long v, long long lo, long long hi, std::string *error) {
  if (v >= lo && v <= hi) return true;
  *error = std::string(name) + " must be in " + std::to_string(lo) + ".." +
           std::to_string(hi) + ", not " + std::to_string(v);
  return false;
}

// "P" sets G2 and G3, "P1,P2,P3" each tier.
bool parse_eviction(const std::string &s, int out[3]) {
  std::vector<int> v;
  for (size_t at = 0;;) {
    size_t comma = s.find(',', at);
    std::string name = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (name == "lru") v.push_back(KVT_EVICT_LRU);
    else if (name == "s3fifo") v.push_back(KVT_EVICT_S3FIFO);
    else return false;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (v.size() == 1) {
    out[1] = out[2] = v[0];
    return true;
  }
  if (v.size() != 3) return false;
  for (int t = 0; t < 3; ++t) out[t] = v[t];
  return true;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  long long page = o.page_size, g1 = o.g1_blocks, g2 = o.g2_blocks, g3 = o.g3_blocks;
  long long layers = o.layers, outer = o.outer, chunk = o.chunk_bytes, conc = o.concurrency;
  long long budget = o.token_budget, running = o.max_running, layer_us = o.layer_forward_us;
  std::string offload = "eager", policy = "presence", mode = "blocks", eviction;
  std::string g1_memory = "host", cuda_copy;
  bool no_progress = false;
  bool no_prefault = false;

  CLI::App app{"kvtier-replay: replays a serving trace through kvtier's tiers (G1, G2, G3) "
               "with real hashing and real copies, and reports hits, transfers and speed."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last wins
  app.add_option("--trace", o.trace, "trace file, one JSON request per line (Mooncake form)")
      ->required();
  app.add_option("--mode", mode, "blocks: block calls per request, kvtier's own G1; engine: a "
                               "continuous-batching engine owns G1 and reaches G2/G3 through "
                               "the connector (blocks)");
  app.add_option("--token-budget", budget, "engine: tokens computed per step (2048)");
  app.add_option("--max-running", running, "engine: requests running at once (64)");
  app.add_option("--layer-forward-us", layer_us, "engine: busy microseconds of each layer's "
                 "simulated forward, between its wait_for_layer_load and save_kv_layer (0)");
  app.add_flag("--compare-bare", o.compare_bare, "engine: after the run, its steps' forwards "
               "again without the connector, to compare step times (bare_step_wall_us)");
  app.add_option("--page-size", page, "tokens per block (512)");
  app.add_option("--g1-blocks", g1, "G1 capacity in blocks (4000)");
  app.add_option("--g2-blocks", g2, "G2 (host) capacity in blocks; 0 leaves G2 out (20000)");
  app.add_option("--g3-blocks", g3, "G3 (disk) capacity in blocks; 0 leaves G3 out (60000)");
  app.add_option("--layers", layers, "layers per block (1)");
  app.add_option("--outer", outer, "2: separate K and V; 1: fused (2)");
  app.add_option("--chunk-bytes", chunk, "bytes of one (layer, K/V) chunk (16384)");
  app.add_option("--concurrency", conc, "requests in flight, started in trace order (1)");
  app.add_option("--offload", offload, "eager: offload new blocks as they are registered; "
                                       "lazy: when they leave their tier (eager)");
  app.add_option("--policy", policy, "presence, or frequency:N (presence)");
  app.add_option("--eviction", eviction, "lru or s3fifo for G2 and G3, or G1,G2,G3 each "
                 "(the library's defaults)");
  app.add_option("--g3-path", o.g3_path, "directory for G3's file (a temporary directory)");
  app.add_flag("--g3-keep", o.g3_keep, "keep G3's file in --g3-path after the run, and start "
               "from the blocks a kept file holds");
  app.add_option("--g4", o.g4_url, "G4 on Redis (redis://host:port[/db] or unix:///path; a "
                                   "comma-separated list of them: shards; "
                                   "redis+cluster://host:port,...: a Redis Cluster): "
                                   "blocks offloaded to G2/G3 also go there, and misses in "
                                   "G1-G3 are looked up there (blocks mode)");
  app.add_option("--g4-key-env", o.g4_key_env, "the environment variable holding G4's key, 64 "
                 "hex digits: values are authenticated with it (docs/G4.md, Keyed values)");
  app.add_flag("--json", o.json, "print one JSON object on stdout instead of the summary");
  std::string shard;
  app.add_option("--shard", shard, "I/N: replay only conversation shard I of N (a request's "
                                   "conversation: its second block id), as one of N instances");
  app.add_option("--metrics-port", o.metrics_port, "serve kvt_metrics_text as Prometheus "
                 "text at http://127.0.0.1:N/metrics while the replay runs")
      ->check(CLI::Range(1, 65535));
  app.add_option("--console-socket", o.console_socket, "serve the management endpoint on this "
                 "Unix-domain socket while the replay runs; watch it with kvtier-console");
  app.add_flag("--verify-record", o.verify_record, "with --record, engine mode: at the end, "
               "replay the log into a fresh manager and compare the registries, the slots and "
               "the transition counts with the run's (JSON: record_replay)");
  app.add_option("--record", o.record, "write every event of the run (slots, candidates, "
                 "blocks, transfers) to this event log; read it with kvtier-events");
  app.add_option("--dump-registry", o.dump_registry, "at the end, write the hashes each tier "
                 "holds as JSON {\"G1\": [...], ...} to this file (blocks mode)");
  app.add_option("--kv-events", o.kv_events, "publish KV events in vLLM's ZMQ format on this "
                 "endpoint: bound with a wildcard (tcp://*:5557), else connected");
  app.add_option("--kv-events-replay", o.kv_events_replay, "answer replay requests on a "
                 "ROUTER socket bound here (needs --kv-events)");
  app.add_option("--kv-events-topic", o.kv_events_topic, "the topic frame of every KV-event "
                 "message (\"\")");
  app.add_option("--kv-events-buffer", o.kv_events_buffer, "batches kept for replay (10000)");
  app.add_option("--kv-events-hold", o.kv_events_hold_s, "seconds the manager, and so its KV "
                 "event sockets, stay up after the replay, for late subscribers (0)");
  app.add_option("--timeline", o.timeline_csv, "write per-interval hit rates and bandwidths "
                                               "as CSV");
  app.add_option("--plot", o.plot_svg, "write an SVG of hit rate per tier over trace time");
  app.add_option("--interval", o.interval_s, "timeline interval in trace seconds (60)");
  app.add_flag("--no-progress", no_progress, "no progress bar on stderr");
  app.add_option("--g1-memory", g1_memory, "host: G1 in host memory, the stand-in for a GPU; "
                 "cuda: G1 in CUDA device memory on device 0, G2 pinned (host)");
  app.add_option("--cuda-copy", cuda_copy, "with --g1-memory cuda: batched, per-chunk, kernel "
                 "or auto, how scattered chunks cross PCIe (the library's default: auto)");
  app.add_flag("--no-prefault", no_prefault,
               "leave G1 and G2 pages to be faulted in by the copies (a GPU host pins, and so "
               "faults in, G2 when the manager starts)");
  CLI11_PARSE(app, argc, argv);

  std::string err;
  if (!in_range("--page-size", page, 1, 65536, &err) ||
      !in_range("--g1-blocks", g1, 1, KVT_MAX_TIER_BLOCKS, &err) ||
      !in_range("--g2-blocks", g2, 0, KVT_MAX_TIER_BLOCKS, &err) ||
      !in_range("--g3-blocks", g3, 0, KVT_MAX_TIER_BLOCKS, &err) ||
      !in_range("--layers", layers, 1, 65536, &err) ||
      !in_range("--outer", outer, 1, 2, &err) ||
      !in_range("--chunk-bytes", chunk, 0, 1ll << 30, &err) ||
      !in_range("--concurrency", conc, 1, 4096, &err) ||
      !in_range("--token-budget", budget, 1, 1 << 24, &err) ||
      !in_range("--max-running", running, 1, 1 << 16, &err) ||
      !in_range("--layer-forward-us", layer_us, 0, 10'000'000, &err))
    return usage_error(err);
  if (g1_memory == "cuda") {
    if (std::string why; !g1_cuda_ready(&why)) return usage_error("--g1-memory cuda: " + why);
    o.g1_cuda = true;
  } else if (g1_memory != "host") {
    return usage_error("--g1-memory must be host or cuda, not \"" + g1_memory + "\"");
  }
  if (!cuda_copy.empty()) {
    const char *names[] = {"batched", "per-chunk", "kernel", "auto"};
    for (int i = 0; i < 4; ++i)
      if (cuda_copy == names[i]) o.cuda_copy = i;
    if (o.cuda_copy < 0)
      return usage_error("--cuda-copy must be batched, per-chunk, kernel or auto, not \"" +
                         cuda_copy + "\"");
  }
  if (mode == "engine") o.mode = Mode::Engine;
  else if (mode != "blocks") return usage_error("--mode must be blocks or engine, not \"" + mode + "\"");
  if (o.g3_keep && (o.g3_path.empty() || g3 == 0 || o.mode == Mode::Engine))
    return usage_error("--g3-keep needs --g3-path, G3 (--g3-blocks > 0) and --mode blocks");
  if (!o.g4_key_env.empty() && o.g4_url.empty())
    return usage_error("--g4-key-env needs --g4");
  o.token_budget = uint32_t(budget);
  o.max_running = uint32_t(running);
  o.layer_forward_us = uint32_t(layer_us);
  if (o.mode == Mode::Engine) {
    // What only the block calls do; the connector has its own.
    if (conc != 1 || policy != "presence" || !o.timeline_csv.empty() || !o.plot_svg.empty() ||
        !o.g4_url.empty())
      return usage_error("--concurrency, --policy, --timeline, --plot and --g4 apply to --mode "
                         "blocks only");
  } else if (layer_us != 0 || o.compare_bare) {
    return usage_error("--layer-forward-us and --compare-bare apply to --mode engine only");
  }
  if (o.mode == Mode::Engine) {
    if (chunk == 0) return usage_error("--mode engine needs --chunk-bytes > 0");
    if (g2 == 0 && g3 == 0) return usage_error("--mode engine needs G2 or G3");
  }
  o.page_size = uint32_t(page);
  o.g1_blocks = uint64_t(g1);
  o.g2_blocks = uint64_t(g2);
  o.g3_blocks = uint64_t(g3);
  o.layers = uint32_t(layers);
  o.outer = uint32_t(outer);
  o.chunk_bytes = uint64_t(chunk);
  o.concurrency = uint32_t(conc);
  o.progress = !no_progress && !o.json;
  o.prefault = !no_prefault;
  if (offload == "eager") o.offload = Offload::Eager;
  else if (offload == "lazy") o.offload = Offload::Lazy;
  else return usage_error("--offload must be eager or lazy, not \"" + offload + "\"");
  if (policy.rfind("frequency:", 0) == 0) {
    char *end = nullptr;
    long long n = std::strtoll(policy.c_str() + 10, &end, 10);
    if (*end != '\0' || policy.size() == 10 || !in_range("frequency:N", n, 1, 1 << 20, &err))
      return usage_error("--policy frequency:N needs an N in 1..1048576, not \"" + policy + "\"");
    o.min_frequency = uint32_t(n);
  } else if (policy != "presence") {
    return usage_error("--policy must be presence or frequency:N, not \"" + policy + "\"");
  }
  if (!eviction.empty() && !parse_eviction(eviction, o.eviction))
    return usage_error("--eviction takes lru or s3fifo, or three of them for G1,G2,G3 "
                       "separated by commas, not \"" + eviction + "\"");
  if (!(o.interval_s > 0) || o.interval_s > 1e9)
    return usage_error("--interval must be a positive number of seconds");
  const double host_bytes =
      double((o.g1_cuda ? 0 : o.g1_blocks) + o.g2_blocks) * double(o.block_bytes());
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (host_bytes > 0.8 * ram) {
    char b[200];
    std::snprintf(b, sizeof b, "G1 and G2 would need %.1f GB of host memory; this machine "
                  "has %.1f GB", host_bytes / 1e9, ram / 1e9);
    return usage_error(b);
  }

  if (!shard.empty()) {
    unsigned i = 0, n = 0;
    char end = 0;
    if (std::sscanf(shard.c_str(), "%u/%u%c", &i, &n, &end) != 2 || n == 0 || i >= n)
      return usage_error("--shard takes I/N with I < N, not \"" + shard + "\"");
    o.shard_index = i;
    o.shard_count = n;
  }
  if (!o.kv_events_replay.empty() && o.kv_events.empty())
    return usage_error("--kv-events-replay needs --kv-events");
  if (!(o.kv_events_hold_s >= 0) || o.kv_events_hold_s > 3600)
    return usage_error("--kv-events-hold must be in 0..3600 seconds");
  if (o.mode == Mode::Engine && (!o.dump_registry.empty() || o.kv_events_hold_s > 0))
    return usage_error("--dump-registry and --kv-events-hold apply to --mode blocks only");
  if (o.verify_record && (o.record.empty() || o.mode != Mode::Engine))
    return usage_error("--verify-record needs --record and --mode engine");

  Trace trace;
  if (!load_trace(o.trace, &trace, &err)) return usage_error(err);
  if (o.shard_count > 1) {
    keep_shard(&trace, o.shard_index, o.shard_count);
    if (trace.requests.empty()) return usage_error("--shard " + shard + " holds no requests");
  }
  for (const Request &r : trace.requests) {
    uint64_t need = r.n_ids * kTokensPerId / o.page_size;
    if (o.mode == Mode::Engine) {
      if (r.n_ids == 0)
        return usage_error("--mode engine: the request on line " + std::to_string(r.line) +
                           " has no tokens");
      need = (r.input_length + r.output_length + o.page_size - 1) / o.page_size;
    }
    if (need > o.g1_blocks)
      return usage_error("G1 is smaller than one request: the request on line " +
                         std::to_string(r.line) + " needs " + std::to_string(need) +
                         " blocks, --g1-blocks is " + std::to_string(o.g1_blocks));
  }

  if (o.mode == Mode::Engine) {
    EngineResult e;
    if (!run_engine(o, trace, &e, &err)) {
      std::fprintf(stderr, "kvtier-replay: %s\n", err.c_str());
      return 1;
    }
    if (o.json) print_engine_json(stdout, o, trace, e);
    else print_engine_summary(stdout, o, trace, e);
    return e.mismatched == 0 ? 0 : 1;
  }

  Result r;
  if (!run_replay(o, trace, &r, &err)) {
    std::fprintf(stderr, "kvtier-replay: %s\n", err.c_str());
    return 1;
  }
  if (o.json) print_json(stdout, o, trace, r);
  else print_summary(stdout, o, trace, r);
  if (!o.timeline_csv.empty() && !write_timeline(o.timeline_csv, o, r, &err)) {
    std::fprintf(stderr, "kvtier-replay: %s\n", err.c_str());
    return 1;
  }
  if (!o.plot_svg.empty() && !write_plot(o.plot_svg, o, trace, r, &err)) {
    std::fprintf(stderr, "kvtier-replay: %s\n", err.c_str());
    return 1;
  }
  return r.mismatched == 0 ? 0 : 1;
}
