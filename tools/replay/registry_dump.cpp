#include "registry_dump.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvt::replay {

bool dump_registry(kvt_manager *m, const Options &o, const Trace &t, uint64_t salt_hash,
                   const std::string &path, std::string *error) {
  // Every hash the run computed: its requests' tokens hashed as the replayer hashes them.
  std::vector<uint64_t> all;
  std::vector<uint32_t> tokens;
  for (const Request &r : t.requests) {
    tokens.resize(r.n_ids * 512);
    for (size_t k = 0; k < r.n_ids; ++k)
      for (uint32_t j = 0; j < 512; ++j) tokens[k * 512 + j] = t.ids[r.first_id + k] * 512 + j;
    size_t n = tokens.size() / o.page_size, at = all.size();
    all.resize(at + n);
    if (kvt_hash_sequence(all.data() + at, &n, n, salt_hash, tokens.data(), tokens.size(),
                          o.page_size) != KVT_OK) {
      *error = std::string("--dump-registry: kvt_hash_sequence: ") + kvt_last_error();
      return false;
    }
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());

  nlohmann::json out = nlohmann::json::object();
  const std::pair<kvt_tier, uint64_t> tiers[] = {
      {KVT_TIER_G1, o.g1_blocks}, {KVT_TIER_G2, o.g2_blocks}, {KVT_TIER_G3, o.g3_blocks}};
  for (auto [tier, blocks] : tiers) {
    if (blocks == 0) continue;
    std::vector<uint64_t> held;
    for (uint64_t h : all) {
      size_t k = 0;
      kvt_block b = 0;
      if (kvt_status st = kvt_match_prefix(&k, &b, m, tier, &h, 1); st != KVT_OK) {
        *error = std::string("--dump-registry: kvt_match_prefix: ") + kvt_last_error();
        return false;
      }
      if (k == 0) continue;
      held.push_back(h);
      kvt_block_release(m, &b, 1);
    }
    out["G" + std::to_string(int(tier))] = held;
  }
  const std::string aside = path + ".partial";
  {
    std::ofstream f(aside, std::ios::trunc);
    f << out.dump() << '\n';
    if (!f.flush()) {
      *error = "--dump-registry: cannot write " + aside;
      return false;
    }
  }
  if (std::rename(aside.c_str(), path.c_str()) != 0) {
    *error = "--dump-registry: cannot rename " + aside + " to " + path;
    return false;
  }
  return true;
}

void keep_shard(Trace *t, uint32_t index, uint32_t count) {
  std::vector<Request> kept;
  uint64_t blocks = 0;
  for (const Request &r : t->requests) {
    if (r.n_ids == 0) continue;
    uint32_t conversation = t->ids[r.first_id + (r.n_ids > 1 ? 1 : 0)];
    if (conversation % count != index) continue;
    kept.push_back(r);
    blocks += r.n_ids;
  }
  t->requests = std::move(kept);
  t->blocks = blocks;
}

}  // namespace kvt::replay
