#include "report.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvtier.h"

namespace kvt::replay {

namespace {

double pct(uint64_t a, uint64_t b) { return b ? 100.0 * double(a) / double(b) : 0.0; }
double gb(uint64_t bytes) { return double(bytes) / 1e9; }
double mean(const std::vector<double> &v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / double(v.size());
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}
// Engine bandwidth: bytes over the time the copy engines spent on them.
double gbps(const DirectionTotals &d) { return d.busy_ns ? double(d.bytes) / double(d.busy_ns) : 0; }

void print_transfers(std::FILE *f, const DirectionTotals *dir) {
  std::fprintf(f, "transfers   direction  blocks      bytes       engine bandwidth  "
               "cancelled  failed\n");
  for (int d = 0; d < kDirections; ++d) {
    const DirectionTotals &x = dir[d];
    if (x.completed + x.cancelled + x.failed == 0) continue;
    std::fprintf(f, "            %-9s  %-10llu  %6.2f GB   %6.2f GB/s        %-9llu  %llu\n",
                 kDirectionNames[d], (unsigned long long)x.blocks, gb(x.bytes), gbps(x),
                 (unsigned long long)x.cancelled, (unsigned long long)x.failed);
  }
}

void add_transfers(nlohmann::ordered_json &j, const DirectionTotals *dir) {
  uint64_t cancelled = 0, failed = 0;
  nlohmann::ordered_json dirs = nlohmann::ordered_json::object();
  for (int d = 0; d < kDirections; ++d) {
    const DirectionTotals &x = dir[d];
    cancelled += x.cancelled;
    failed += x.failed;
    dirs[kDirectionNames[d]] = {{"transfers", x.completed}, {"cancelled", x.cancelled},
                                {"failed", x.failed},       {"blocks", x.blocks},
                                {"bytes", x.bytes},         {"busy_seconds", x.busy_ns / 1e9},
                                {"gb_per_s", gbps(x)}};
  }
  j["cancelled_transfers"] = cancelled;
  j["failed_transfers"] = failed;
  j["transfers"] = dirs;
}

std::string tier_size(uint64_t blocks, uint64_t block_bytes) {
  char b[64];
  std::snprintf(b, sizeof b, "%llu blocks (%.2f GB)", (unsigned long long)blocks,
                gb(blocks * block_bytes));
  return b;
}

std::string policy_name(const Options &o) {
  return o.min_frequency ? "frequency:" + std::to_string(o.min_frequency) : "presence";
}

// "PREFILLING" for KVT_SLOT_PREFILLING; "NONE" for 0, where slots are created.
std::string slot_name(uint32_t state) {
  if (state == 0) return "NONE";
  std::string s = kvt_slot_state_str(state);
  return s.rfind("KVT_SLOT_", 0) == 0 ? s.substr(9) : s;
}

}  // namespace

void print_summary(std::FILE *f, const Options &o, const Trace &t, const Result &r) {
  const uint64_t bb = o.block_bytes();
  std::fprintf(f, "kvtier-replay %s\n", o.trace.c_str());
  std::fprintf(f, "  trace     %zu requests, %llu blocks of %u tokens\n", t.requests.size(),
               (unsigned long long)r.blocks, o.page_size);
  std::fprintf(f, "  block     %u layer(s) x %u x %llu B = %llu B\n", o.layers, o.outer,
               (unsigned long long)o.chunk_bytes, (unsigned long long)bb);
  std::fprintf(f, "  G1        %s of %s\n", tier_size(o.g1_blocks, bb).c_str(),
               o.g1_cuda ? "CUDA device memory" : "host memory, standing in for GPU memory");
  if (o.g2_blocks) std::fprintf(f, "  G2        %s of host memory\n", tier_size(o.g2_blocks, bb).c_str());
  if (o.g3_blocks)
    std::fprintf(f, "  G3        %s on disk in %s\n", tier_size(o.g3_blocks, bb).c_str(),
                 o.g3_path.empty() ? "a temporary directory" : o.g3_path.c_str());
  std::fprintf(f, "  offload   %s, policy %s, %u request(s) in flight\n\n",
               o.offload == Offload::Eager ? "eager" : "lazy", policy_name(o).c_str(),
               o.concurrency);

  std::fprintf(f, "hits        G1 %llu (%.1f%%)  G2 %llu (%.1f%%)  G3 %llu (%.1f%%)  "
               "all tiers %llu (%.1f%%)\n",
               (unsigned long long)r.hits[1], pct(r.hits[1], r.blocks),
               (unsigned long long)r.hits[2], pct(r.hits[2], r.blocks),
               (unsigned long long)r.hits[3], pct(r.hits[3], r.blocks),
               (unsigned long long)r.hit_blocks(), pct(r.hit_blocks(), r.blocks));
  if (!o.g4_url.empty())
    std::fprintf(f, "G4          hits %llu (%.1f%%), stored %llu, failed %llu, at %s\n",
                 (unsigned long long)r.hits[4], pct(r.hits[4], r.blocks),
                 (unsigned long long)r.g4_stored, (unsigned long long)r.g4_failed,
                 o.g4_url.c_str());
  std::fprintf(f, "misses      %llu (%.1f%%), computed and registered\n",
               (unsigned long long)r.misses, pct(r.misses, r.blocks));
  print_transfers(f, r.dir);
  std::fprintf(f, "            offloaded %llu blocks, onboarded %llu blocks\n",
               (unsigned long long)r.offloaded_blocks(),
               (unsigned long long)r.onboarded_blocks());
  std::fprintf(f, "verified    %llu onboarded blocks hold the bytes of their hash, "
               "%llu mismatched\n",
               (unsigned long long)r.verified, (unsigned long long)r.mismatched);
  std::fprintf(f, "wall        %.2f s: %.0f requests/s, %.0f blocks/s\n", r.seconds,
               double(r.requests) / r.seconds, double(r.blocks) / r.seconds);
}

void print_json(std::FILE *f, const Options &o, const Trace &t, const Result &r) {
  nlohmann::ordered_json j;
  j["trace"] = o.trace;
  j["requests"] = r.requests;
  j["blocks"] = r.blocks;
  j["g1_hit_blocks"] = r.hits[1];
  j["g2_hit_blocks"] = r.hits[2];
  j["g3_hit_blocks"] = r.hits[3];
  j["g3_recovered_blocks"] = r.g3_recovered;
  j["g4_hit_blocks"] = r.hits[4];
  j["g4_stored_blocks"] = r.g4_stored;
  j["g4_failed_blocks"] = r.g4_failed;
  j["miss_blocks"] = r.misses;
  j["hit_rate"] = r.blocks ? double(r.hit_blocks()) / double(r.blocks) : 0.0;
  j["offloaded_blocks"] = r.offloaded_blocks();
  j["onboarded_blocks"] = r.onboarded_blocks();
  j["verified_blocks"] = r.verified;
  j["mismatched_blocks"] = r.mismatched;
  add_transfers(j, r.dir);
  j["alloc_waits"] = r.alloc_waits;
  j["seconds"] = r.seconds;
  j["prefault_seconds"] = r.prefault_seconds;
  j["config"] = {{"page_size", o.page_size},     {"g1_blocks", o.g1_blocks},
                 {"g2_blocks", o.g2_blocks},     {"g3_blocks", o.g3_blocks},
                 {"layers", o.layers},           {"outer", o.outer},
                 {"chunk_bytes", o.chunk_bytes}, {"block_bytes", o.block_bytes()},
                 {"concurrency", o.concurrency},
                 {"offload", o.offload == Offload::Eager ? "eager" : "lazy"},
                 {"policy", policy_name(o)},     {"trace_requests", t.requests.size()},
                 {"g1_memory", o.g1_cuda ? "cuda" : "host"}};
  std::fprintf(f, "%s\n", j.dump(2).c_str());
}

void print_engine_summary(std::FILE *f, const Options &o, const Trace &t, const EngineResult &r) {
  const uint64_t bb = o.block_bytes();
  std::fprintf(f, "kvtier-replay --mode engine %s\n", o.trace.c_str());
  std::fprintf(f, "  trace     %zu requests, %llu prompt tokens, %llu sampled; blocks of %u "
               "tokens\n", t.requests.size(), (unsigned long long)r.prompt_tokens,
               (unsigned long long)r.output_tokens, o.page_size);
  std::fprintf(f, "  G1        %s of the engine's %s memory, registered with the "
               "connector\n", tier_size(o.g1_blocks, bb).c_str(), o.g1_cuda ? "CUDA" : "host");
  if (o.g2_blocks) std::fprintf(f, "  G2        %s of host memory\n", tier_size(o.g2_blocks, bb).c_str());
  if (o.g3_blocks)
    std::fprintf(f, "  G3        %s on disk in %s\n", tier_size(o.g3_blocks, bb).c_str(),
                 o.g3_path.empty() ? "a temporary directory" : o.g3_path.c_str());
  std::fprintf(f, "  engine    %u tokens per step, at most %u running, %s offload\n\n",
               o.token_budget, o.max_running, o.offload == Offload::Eager ? "eager" : "lazy");
  std::fprintf(f, "steps       %llu, %llu preemptions\n", (unsigned long long)r.steps,
               (unsigned long long)r.preemptions);
  std::fprintf(f, "prefill     G1 prefix hits %llu tokens, loaded %llu tokens (%.1f%% of the "
               "prompts), computed %llu tokens in all\n", (unsigned long long)r.g1_hit_tokens,
               (unsigned long long)r.loaded_tokens, pct(r.loaded_tokens, r.prompt_tokens),
               (unsigned long long)r.computed_tokens);
  std::fprintf(f, "stores      %llu blocks stored, %llu failed\n",
               (unsigned long long)r.stored_blocks, (unsigned long long)r.store_failures);
  print_transfers(f, r.dir);
  std::fprintf(f, "verified    %llu loaded blocks hold the bytes of their hash, "
               "%llu mismatched, %llu load errors recomputed\n", (unsigned long long)r.verified,
               (unsigned long long)r.mismatched, (unsigned long long)r.load_error_blocks);
  std::fprintf(f, "wall        %.2f s: %.0f requests/s, %.0f steps/s\n", r.seconds,
               double(r.requests) / r.seconds, double(r.steps) / r.seconds);
  std::fprintf(f, "step        %.0f us mean, %.0f us median, bind to wait_for_save (%u us of "
               "forward per layer)\n", mean(r.step_us), median(r.step_us), o.layer_forward_us);
  if (o.compare_bare)
    std::fprintf(f, "bare step   %.0f us mean, %.0f us median, the same forwards without the "
                 "connector: %.3fx by median\n", mean(r.bare_step_us), median(r.bare_step_us),
                 median(r.step_us) / median(r.bare_step_us));
}

void print_engine_json(std::FILE *f, const Options &o, const Trace &t, const EngineResult &r) {
  nlohmann::ordered_json j;
  j["trace"] = o.trace;
  j["mode"] = "engine";
  j["requests"] = r.requests;
  j["steps"] = r.steps;
  j["preemptions"] = r.preemptions;
  j["prompt_tokens"] = r.prompt_tokens;
  j["output_tokens"] = r.output_tokens;
  j["computed_tokens"] = r.computed_tokens;
  j["g1_hit_tokens"] = r.g1_hit_tokens;
  j["loaded_tokens"] = r.loaded_tokens;
  j["prefill_tokens_saved"] = r.prefill_tokens_saved;
  j["load_error_blocks"] = r.load_error_blocks;
  j["stored_blocks"] = r.stored_blocks;
  j["store_failures"] = r.store_failures;
  j["verified_blocks"] = r.verified;
  j["mismatched_blocks"] = r.mismatched;
  add_transfers(j, r.dir);
  nlohmann::ordered_json tr = nlohmann::ordered_json::object();
  for (uint32_t from = 0; from < 11; ++from)
    for (uint32_t to = 0; to < 11; ++to)
      if (r.transitions[from][to]) tr[slot_name(from) + "->" + slot_name(to)] = r.transitions[from][to];
  j["slot_transitions"] = tr;
  if (const auto &v = r.record_replay; v.done)
    j["record_replay"] = {{"events", v.r.events},
                          {"violations", v.r.violations},
                          {"first_violation", v.first_violation},
                          {"torn", v.r.torn != 0},
                          {"live_slots", v.r.live_slots},
                          {"finished_slots", v.r.finished_slots},
                          {"open_batches", v.r.open_batches},
                          {"loaded_blocks", v.r.loaded_blocks},
                          {"registered", {{"G1", v.r.registered[1]}, {"G2", v.r.registered[2]},
                                          {"G3", v.r.registered[3]}}},
                          {"same_registry", v.same_registry},
                          {"same_transitions", v.same_transitions},
                          {"seconds", v.seconds},
                          {"rerun", {{"calls", v.rerun.calls},
                                     {"violations", v.rerun.violations},
                                     {"first_violation", v.rerun_first},
                                     {"live_slots", v.rerun.live_slots},
                                     {"same_slots", v.rerun_same_slots},
                                     {"same_registry", v.rerun_same_registry},
                                     {"same_counters", v.rerun_same_counters},
                                     {"seconds", v.rerun_seconds}}}};
  j["seconds"] = r.seconds;
  j["prefault_seconds"] = r.prefault_seconds;
  j["step_wall_us"] = {{"mean", mean(r.step_us)}, {"median", median(r.step_us)}};
  if (o.compare_bare)
    j["bare_step_wall_us"] = {{"mean", mean(r.bare_step_us)}, {"median", median(r.bare_step_us)}};
  j["config"] = {{"page_size", o.page_size},       {"g1_blocks", o.g1_blocks},
                 {"g2_blocks", o.g2_blocks},       {"g3_blocks", o.g3_blocks},
                 {"layers", o.layers},             {"outer", o.outer},
                 {"chunk_bytes", o.chunk_bytes},   {"block_bytes", o.block_bytes()},
                 {"token_budget", o.token_budget}, {"max_running", o.max_running},
                 {"layer_forward_us", o.layer_forward_us},
                 {"offload", o.offload == Offload::Eager ? "eager" : "lazy"},
                 {"trace_requests", t.requests.size()},
                 {"g1_memory", o.g1_cuda ? "cuda" : "host"}};
  std::fprintf(f, "%s\n", j.dump(2).c_str());
}

bool write_timeline(const std::string &path, const Options &o, const Result &r,
                    std::string *error) {
  std::ofstream out(path);
  if (!out) {
    *error = path + ": cannot write the timeline";
    return false;
  }
  out << "interval_begin_s,interval_end_s,requests,blocks,g1_hit_rate,g2_hit_rate,"
         "g3_hit_rate,hit_rate,offload_bytes,onboard_bytes,wall_s,offload_gb_per_s,"
         "onboard_gb_per_s\n";
  for (size_t i = 0; i < r.timeline.size(); ++i) {
    const Interval &v = r.timeline[i];
    const double wall = v.requests ? v.wall_end - v.wall_begin : 0;
    auto rate = [&](uint64_t h) { return v.blocks ? double(h) / double(v.blocks) : 0.0; };
    auto bw = [&](uint64_t b) { return wall > 0 ? double(b) / wall / 1e9 : 0.0; };
    char line[512];
    std::snprintf(line, sizeof line,
                  "%.0f,%.0f,%llu,%llu,%.4f,%.4f,%.4f,%.4f,%llu,%llu,%.6f,%.3f,%.3f\n",
                  double(i) * o.interval_s, double(i + 1) * o.interval_s,
                  (unsigned long long)v.requests, (unsigned long long)v.blocks,
                  rate(v.hits[1]), rate(v.hits[2]), rate(v.hits[3]),
                  rate(v.hit_blocks()), (unsigned long long)v.offload_bytes,
                  (unsigned long long)v.onboard_bytes, wall, bw(v.offload_bytes),
                  bw(v.onboard_bytes));
    out << line;
  }
  if (!out.flush()) {
    *error = path + ": write error";
    return false;
  }
  return true;
}

// Hit rate per tier over trace time, as stacked areas: G1 at the bottom, then G2 and G3, so
// that the top edge is the overall hit rate.
bool write_plot(const std::string &path, const Options &o, const Trace &t, const Result &r,
                std::string *error) {
  std::ofstream out(path);
  if (!out) {
    *error = path + ": cannot write the plot";
    return false;
  }
  const double W = 900, H = 420, left = 60, right = 150, top = 40, bottom = 50;
  const double pw = W - left - right, ph = H - top - bottom;
  const size_t n = r.timeline.size();
  const double minutes = double(n) * o.interval_s / 60.0;
  auto x = [&](double i) { return left + pw * i / double(n); };
  auto y = [&](double rate) { return top + ph * (1.0 - rate); };
  char buf[256];
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof buf,
                "<text x=\"%g\" y=\"22\" font-size=\"15\">kvtier-replay: hit rate per tier, "
                "%zu requests</text>\n",
                left, t.requests.size());
  out << buf;
  // Cumulative rates per interval: G1, G1+G2, G1+G2+G3.
  std::vector<std::array<double, 4>> cum(n);
  for (size_t i = 0; i < n; ++i) {
    const Interval &v = r.timeline[i];
    double b = v.blocks ? double(v.blocks) : 1.0;
    cum[i][0] = 0;
    for (int k = 1; k <= 3; ++k) cum[i][k] = cum[i][k - 1] + double(v.hits[k]) / b;
  }
  const char *colors[] = {"", "#1f77b4", "#ff7f0e", "#2ca02c"};
  const char *names[] = {"", "G1 hits", "G2 hits", "G3 hits"};
  for (int k = 1; k <= 3; ++k) {
    out << "<polygon fill=\"" << colors[k] << "\" fill-opacity=\"0.8\" points=\"";
    for (size_t i = 0; i < n; ++i) {  // upper edge, left to right, a step per interval
      std::snprintf(buf, sizeof buf, "%.1f,%.1f %.1f,%.1f ", x(double(i)), y(cum[i][k]),
                    x(double(i + 1)), y(cum[i][k]));
      out << buf;
    }
    for (size_t i = n; i-- > 0;) {  // lower edge back
      std::snprintf(buf, sizeof buf, "%.1f,%.1f %.1f,%.1f ", x(double(i + 1)),
                    y(cum[i][k - 1]), x(double(i)), y(cum[i][k - 1]));
      out << buf;
    }
    out << "\"/>\n";
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"14\" fill=\"%s\"/>"
                  "<text x=\"%g\" y=\"%g\">%s</text>\n",
                  W - right + 15, top + 24.0 * (3 - k), colors[k], W - right + 35,
                  top + 24.0 * (3 - k) + 11, names[k]);
    out << buf;
  }
  // Axes, grid and labels.
  for (int p = 0; p <= 100; p += 20) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ccc\"/>"
                  "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n",
                  left, y(p / 100.0), left + pw, y(p / 100.0), left - 6, y(p / 100.0) + 4, p);
    out << buf;
  }
  const int ticks = 6;
  for (int k = 0; k <= ticks; ++k) {
    double m = minutes * k / ticks;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%.0f</text>\n",
                  left + pw * k / ticks, top + ph + 18, m);
    out << buf;
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">trace time (minutes), "
                "%g s intervals</text>\n"
                "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" "
                "stroke=\"black\"/>\n",
                left + pw / 2, H - 12, o.interval_s, left, top, pw, ph);
  out << buf << "</svg>\n";
  if (!out.flush()) {
    *error = path + ": write error";
    return false;
  }
  return true;
}

}  // namespace kvt::replay
