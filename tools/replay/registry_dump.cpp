#include "registry_dump.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvt::replay {

bool dump_registry(kvt_manager *m, const Options &o, const std::string &path,
                   std::string *error) {
  nlohmann::json out = nlohmann::json::object();
  const std::pair<kvt_tier, uint64_t> tiers[] = {
      {KVT_TIER_G1, o.g1_blocks}, {KVT_TIER_G2, o.g2_blocks}, {KVT_TIER_G3, o.g3_blocks}};
  for (auto [tier, blocks] : tiers) {
    if (blocks == 0) continue;
    std::vector<uint64_t> held(blocks);
    size_t n = 0;
    if (kvt_tier_hashes(held.data(), held.size(), &n, m, tier) != KVT_OK) {
      *error = std::string("--dump-registry: kvt_tier_hashes: ") + kvt_last_error();
      return false;
    }
    held.resize(n);
    std::sort(held.begin(), held.end());
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
