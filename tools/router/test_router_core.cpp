// kvtier-router's core without sockets: the decoder on vLLM's layouts and on malformed bytes,
// the replay replies, the index, the streams' gaps and restarts, and routing by tokens.
#include <gtest/gtest.h>

#include <msgpack.hpp>

#include <string>
#include <vector>

#include "core.hpp"
#include "event_decoder.hpp"
#include "index.hpp"
#include "kvtier.h"

using namespace kvt::router;

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

std::string bytes(const msgpack::sbuffer &b) { return std::string(b.data(), b.size()); }

void pack_hashes(Packer &p, const std::vector<uint64_t> &h) {
  p.pack_array(uint32_t(h.size()));
  for (uint64_t x : h) p.pack_uint64(x);
}

// ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, extra...]
void stored(Packer &p, const std::vector<uint64_t> &h, const char *medium, int extra = 0,
            bool with_medium = true) {
  p.pack_array(6 + with_medium + extra);
  p.pack(std::string("BlockStored"));
  pack_hashes(p, h);
  p.pack_nil();
  p.pack_array(2);
  p.pack_uint32(1);
  p.pack_uint32(2);
  p.pack_uint32(16);
  p.pack_nil();
  if (with_medium) {
    if (medium) p.pack(std::string(medium));
    else p.pack_nil();
  }
  for (int i = 0; i < extra; ++i) p.pack(std::string("future field"));
}

void removed(Packer &p, const std::vector<uint64_t> &h, const char *medium) {
  p.pack_array(3);
  p.pack(std::string("BlockRemoved"));
  pack_hashes(p, h);
  p.pack(std::string(medium));
}

// [ts, [events], dp_rank], the events written by `events`.
template <class F>
std::string batch(uint32_t n_events, F events, int fields = 3) {
  msgpack::sbuffer b;
  Packer p(b);
  p.pack_array(fields);
  p.pack_double(1.5);
  p.pack_array(n_events);
  events(p);
  if (fields > 2) p.pack_int32(0);
  for (int i = 3; i < fields; ++i) p.pack_nil();
  return bytes(b);
}

bool decode(const std::string &s, Batch *b, std::string *err) {
  return decode_batch(reinterpret_cast<const uint8_t *>(s.data()), s.size(), b, err);
}

std::string refusal(const std::string &s) {
  Batch b;
  std::string err;
  EXPECT_FALSE(decode(s, &b, &err)) << "decoded what should be refused";
  EXPECT_FALSE(err.empty());
  return err;
}

std::string seq_frame(uint64_t s) {
  std::string f(8, '\0');
  for (int i = 0; i < 8; ++i) f[i] = char(s >> (56 - 8 * i));
  return f;
}

}  // namespace

TEST(RouterDecode, ArrayLayoutOfEveryEvent) {
  std::string s = batch(3, [](Packer &p) {
    stored(p, {1, 2, ~uint64_t(0)}, "GPU");
    removed(p, {2}, "CPU");
    p.pack_array(1);
    p.pack(std::string("AllBlocksCleared"));
  });
  Batch b;
  std::string err;
  ASSERT_TRUE(decode(s, &b, &err)) << err;
  EXPECT_EQ(b.ts, 1.5);
  EXPECT_EQ(b.dp_rank, 0);
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].kind, EventKind::Stored);
  EXPECT_EQ(b.events[0].hashes, (std::vector<uint64_t>{1, 2, ~uint64_t(0)}));
  EXPECT_FALSE(b.events[0].parent);
  EXPECT_EQ(b.events[0].n_tokens, 2u);
  EXPECT_EQ(b.events[0].block_size, 16);
  EXPECT_EQ(b.events[0].medium, "GPU");
  EXPECT_EQ(b.events[1].kind, EventKind::Removed);
  EXPECT_EQ(b.events[1].medium, "CPU");
  EXPECT_EQ(b.events[2].kind, EventKind::Cleared);
}

TEST(RouterDecode, ShorterAndLongerArraysAsMsgspecReadsThem) {
  // Old vLLM: no medium, no data_parallel_rank. Future vLLM: more trailing fields.
  Batch b;
  std::string err;
  ASSERT_TRUE(decode(batch(1, [](Packer &p) { stored(p, {7}, nullptr, 0, false); }, 2), &b, &err))
      << err;
  EXPECT_FALSE(b.events[0].medium);
  EXPECT_FALSE(b.dp_rank);
  ASSERT_TRUE(decode(batch(1, [](Packer &p) { stored(p, {7}, "DISK", 4); }, 5), &b, &err)) << err;
  EXPECT_EQ(b.events[0].medium, "DISK");
  // A field without a default cannot be left out.
  std::string s = batch(1, [](Packer &p) {
    p.pack_array(4);
    p.pack(std::string("BlockStored"));
    pack_hashes(p, {1});
    p.pack_nil();
    p.pack_array(0);
  });
  EXPECT_NE(refusal(s).find("block_size"), std::string::npos);
}

TEST(RouterDecode, MapLayoutOfNewerVllm) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(3);
  p.pack_double(2.0);
  p.pack_array(2);
  p.pack_map(8);
  p.pack(std::string("lora_name")); p.pack_nil();  // unknown keys, any order
  p.pack(std::string("type")); p.pack(std::string("BlockStored"));
  p.pack(std::string("block_hashes")); pack_hashes(p, {5, 6});
  p.pack(std::string("parent_block_hash")); p.pack_uint64(4);
  p.pack(std::string("token_ids")); p.pack_array(0);
  p.pack(std::string("block_size")); p.pack_uint32(16);
  p.pack(std::string("lora_id")); p.pack_nil();
  p.pack(std::string("medium")); p.pack(std::string("GPU"));
  p.pack_map(2);
  p.pack(std::string("type")); p.pack(std::string("BlockRemoved"));
  p.pack(std::string("block_hashes")); pack_hashes(p, {5});
  p.pack_nil();
  Batch b;
  std::string err;
  ASSERT_TRUE(decode(bytes(buf), &b, &err)) << err;
  EXPECT_EQ(b.events[0].hashes, (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(b.events[0].parent, 4u);
  EXPECT_EQ(b.events[0].medium, "GPU");
  EXPECT_FALSE(b.events[1].medium);
  EXPECT_FALSE(b.dp_rank);
}

// vLLM main (0231dd5), and kvtier by default: tagged maps as msgspec writes them (omit_defaults:
// the fields with a default only when set), lora_name without a default.
TEST(RouterDecode, MapsOfCurrentVllm) {
  msgpack::sbuffer buf;
  Packer p(buf);
  auto key = [&](const char *k) { p.pack(std::string(k)); };
  p.pack_array(3);
  p.pack_double(3.0);
  p.pack_array(3);
  p.pack_map(8);
  key("type"); p.pack(std::string("BlockStored"));
  key("block_hashes"); pack_hashes(p, {5, 6});
  key("parent_block_hash"); p.pack_nil();
  key("token_ids"); p.pack(std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8});
  key("block_size"); p.pack_uint32(4);
  key("lora_id"); p.pack_nil();
  key("medium"); p.pack(std::string("FS"));
  key("lora_name"); p.pack_nil();
  p.pack_map(6);  // with vLLM's optional fields set
  key("type"); p.pack(std::string("BlockRemoved"));
  key("block_hashes"); pack_hashes(p, {5});
  key("medium"); p.pack(std::string("OBJ"));
  key("group_idx"); p.pack_uint32(1);
  key("locality"); p.pack(std::string("LOCAL"));
  key("kv_cache_spec_kind"); p.pack(std::string("full_attention"));  // a key it does not know
  p.pack_map(1);
  key("type"); p.pack(std::string("AllBlocksCleared"));
  p.pack_uint32(3);
  Batch b;
  std::string err;
  ASSERT_TRUE(decode(bytes(buf), &b, &err)) << err;
  EXPECT_EQ(b.dp_rank, 3);
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].kind, EventKind::Stored);
  EXPECT_EQ(b.events[0].hashes, (std::vector<uint64_t>{5, 6}));
  EXPECT_FALSE(b.events[0].parent);
  EXPECT_EQ(b.events[0].n_tokens, 8u);
  EXPECT_EQ(b.events[0].block_size, 4);
  EXPECT_EQ(b.events[0].medium, "FS");
  EXPECT_EQ(b.events[1].kind, EventKind::Removed);
  EXPECT_EQ(b.events[1].medium, "OBJ");
  EXPECT_EQ(b.events[2].kind, EventKind::Cleared);
}

// A replay socket's replies as a DEALER gets them, from vLLM main (the topic first) and from
// vLLM 0.10/0.11 (without it).
TEST(RouterReplay, RepliesOfBothVllmVersions) {
  const std::string seq = seq_frame(7), end = seq_frame(~uint64_t(0));
  auto reply = [](std::vector<std::string_view> f) { return replay_reply(f); };
  ReplayReply r = reply({"", "kv", seq, "payload"});
  EXPECT_EQ(r.kind, ReplayReply::Batch);
  EXPECT_EQ(r.seq, 7u);
  EXPECT_EQ(r.payload, "payload");
  r = reply({"", seq, "payload"});
  EXPECT_EQ(r.kind, ReplayReply::Batch);
  EXPECT_EQ(r.seq, 7u);
  EXPECT_EQ(r.payload, "payload");
  EXPECT_EQ(reply({"", "", end, ""}).kind, ReplayReply::End);
  EXPECT_EQ(reply({"", end, ""}).kind, ReplayReply::End);
  EXPECT_EQ(reply({"", "kv", end, "x"}).kind, ReplayReply::Batch) << "seq -1 with a payload";
  for (std::vector<std::string_view> bad :
       {std::vector<std::string_view>{"", "payload"}, {"x", seq, "payload"},
        {"", "kv", seq, "payload", "more"}, {"", "kv", "1234", "payload"}, {}}) {
    r = reply(bad);
    EXPECT_EQ(r.kind, ReplayReply::Bad) << bad.size();
    EXPECT_FALSE(r.why.empty());
  }
}

TEST(RouterDecode, MalformedInputIsRefusedWithAReason) {
  const std::string good = batch(1, [](Packer &p) { stored(p, {1}, "GPU"); });
  EXPECT_NE(refusal("").find("msgpack"), std::string::npos);
  EXPECT_NE(refusal(good.substr(0, good.size() - 3)).find("msgpack"), std::string::npos);
  EXPECT_NE(refusal(good + "x").find("trailing"), std::string::npos);
  EXPECT_NE(refusal("\xc1").find("msgpack"), std::string::npos);  // a never-used byte
  EXPECT_NE(refusal("\x2a").find("batch"), std::string::npos);    // an int, not a batch
  EXPECT_NE(refusal(batch(1, [](Packer &p) {
              p.pack_array(1);
              p.pack(std::string("BlockMoved"));
            })).find("unknown tag 'BlockMoved'"), std::string::npos);
  EXPECT_NE(refusal(batch(1, [](Packer &p) {
              p.pack_array(3);
              p.pack(std::string("BlockRemoved"));
              p.pack(std::string("not a list"));
              p.pack_nil();
            })).find("events[0].block_hashes"), std::string::npos);
  EXPECT_NE(refusal(batch(1, [](Packer &p) {
              p.pack_array(3);
              p.pack(std::string("BlockRemoved"));
              p.pack_array(1);
              p.pack_double(1.5);  // a float hash
              p.pack_nil();
            })).find("integer block hash"), std::string::npos);
  EXPECT_NE(refusal(batch(1, [](Packer &p) { p.pack_uint32(3); })).find("array or a map"),
            std::string::npos);
  EXPECT_NE(refusal(batch(1, [](Packer &p) {
              p.pack_map(1);
              p.pack(std::string("block_hashes"));
              p.pack_array(0);
            })).find("'type'"), std::string::npos);
  // Headers that claim 2^32 - 1 elements in a few bytes: refused, not allocated.
  EXPECT_FALSE(refusal(std::string("\x93\xcb\0\0\0\0\0\0\0\0\xdd\xff\xff\xff\xff", 15)).empty());
  EXPECT_FALSE(refusal(std::string("\xdf\xff\xff\xff\xff", 5)).empty());
  // Nesting deeper than any batch needs.
  EXPECT_FALSE(refusal(std::string(200, '\x91') + '\x01').empty());
}

TEST(RouterIndex, MediaAreKeptApart) {
  Index ix;
  size_t a = ix.add_instance();
  Batch b;
  std::string err;
  ASSERT_TRUE(decode(batch(2, [](Packer &p) {
                       stored(p, {1, 2, 3}, "GPU");
                       stored(p, {1, 2}, "CPU");
                     }),
                     &b, &err));
  ix.apply(a, b);
  const uint64_t h[] = {1, 2, 3, 4};
  EXPECT_EQ(ix.prefix(a, h, 4), 3u);
  EXPECT_EQ(ix.prefix(a, h, 4, "CPU"), 2u);
  EXPECT_EQ(ix.prefix(a, h, 4, "DISK"), 0u);
  ASSERT_TRUE(decode(batch(1, [](Packer &p) { removed(p, {1}, "GPU"); }), &b, &err));
  ix.apply(a, b);
  EXPECT_EQ(ix.prefix(a, h, 4), 3u) << "1 is still in CPU";
  EXPECT_EQ(ix.prefix(a, h, 4, "GPU"), 0u);
  ASSERT_TRUE(decode(batch(1, [](Packer &p) { removed(p, {1}, "CPU"); }), &b, &err));
  ix.apply(a, b);
  EXPECT_EQ(ix.prefix(a, h, 4), 0u);
  EXPECT_EQ(ix.blocks(a), 2u);
  EXPECT_EQ(ix.hashes(a, "GPU"), (std::vector<uint64_t>{2, 3}));
}

TEST(RouterCore, GapsAreReportedReplayedAndRestartsClear) {
  Core core(0, 4);
  size_t a = core.add_instance("a");
  auto msg = [](uint64_t seq, const std::string &payload) {
    return std::vector<std::string>{"", seq_frame(seq), payload};
  };
  auto deliver = [&](const std::vector<std::string> &m) {
    return core.deliver(a, {m.begin(), m.end()});
  };
  const std::string s1 = batch(1, [](Packer &p) { stored(p, {1}, "GPU"); });
  const std::string s2 = batch(1, [](Packer &p) { stored(p, {2}, "GPU"); });
  const std::string s3 = batch(1, [](Packer &p) { stored(p, {3}, "GPU"); });

  // Joined late: the first message is number 2, so 0 and 1 are asked for.
  EXPECT_EQ(deliver(msg(2, s3)), 0u);
  core.deliver_replayed(a, 0, s1);
  core.deliver_replayed(a, 1, s2);
  core.deliver_replayed(a, 2, s3);  // past the gap: it comes live
  core.deliver_replayed(a, 3, s3);
  EXPECT_EQ(deliver(msg(2, s3)), std::nullopt);
  StreamStats st = core.stats(a);
  EXPECT_EQ(st.replayed, 2u);
  EXPECT_EQ(st.messages, 1u);
  EXPECT_EQ(st.last_seq, 2u);
  EXPECT_EQ(core.route_hashes({1, 2, 3}).overlap[0], 3u);

  // A gap that replay cannot fill: counted lost, and the index is stale.
  EXPECT_EQ(deliver(msg(6, s1)), 3u);
  EXPECT_FALSE(core.stale(a));
  core.replay_missed(a);
  EXPECT_TRUE(core.stale(a));
  EXPECT_EQ(deliver(msg(6, s1)), std::nullopt);
  EXPECT_EQ(core.stats(a).lost, 3u);

  // Bad messages are counted and skipped; their numbers still count as received.
  EXPECT_EQ(deliver({"", seq_frame(7)}), std::nullopt);
  EXPECT_EQ(deliver({"", "1234", s1}), std::nullopt);
  EXPECT_EQ(deliver(msg(7, "\xc1")), std::nullopt);
  EXPECT_EQ(deliver(msg(8, s2)), std::nullopt);
  st = core.stats(a);
  EXPECT_EQ(st.bad, 3u);
  EXPECT_EQ(st.lost, 3u);
  EXPECT_NE(st.last_error.find("seq 7"), std::string::npos) << st.last_error;

  // The publisher restarted: numbers went back, and its blocks are gone.
  EXPECT_EQ(deliver(msg(0, s3)), std::nullopt);
  EXPECT_EQ(core.stats(a).restarts, 1u);
  EXPECT_EQ(core.route_hashes({1, 2, 3}).overlap[0], 0u);
  EXPECT_EQ(core.hashes(a, std::nullopt), (std::vector<uint64_t>{3}));
}

TEST(RouterCore, RoutesTokensToTheLongestPrefix) {
  uint64_t salt = 0;
  ASSERT_EQ(kvt_hash_salt(&salt, "s", 1), KVT_OK);
  Core core(salt, 4);
  size_t a = core.add_instance("a"), b = core.add_instance("b");
  std::vector<uint32_t> tokens(14);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 100 + i;
  uint64_t h[3];
  size_t n = 0;
  ASSERT_EQ(kvt_hash_tokens(h, 3, &n, salt, tokens.data(), tokens.size(), 4), KVT_OK);
  ASSERT_EQ(n, 3u);
  auto store = [&](size_t inst, uint64_t seq, std::vector<uint64_t> hs, const char *medium) {
    std::vector<std::string> m{"", seq_frame(seq), batch(1, [&](Packer &p) {
                                 stored(p, hs, medium);
                               })};
    EXPECT_EQ(core.deliver(inst, {m.begin(), m.end()}), std::nullopt);
  };
  store(a, 0, {h[0]}, "GPU");
  store(b, 0, {h[0], h[1]}, "CPU");
  store(b, 1, {h[2]}, "GPU");
  Answer ans = core.route(tokens);
  EXPECT_EQ(ans.blocks, 3u);
  ASSERT_TRUE(ans.best);
  EXPECT_EQ(*ans.best, b);
  EXPECT_EQ(ans.overlap, (std::vector<size_t>{1, 3}));
  // b holds the first two in CPU, the third only in GPU: its GPU prefix is empty.
  std::vector<std::string> media = core.media();
  ASSERT_EQ(media, (std::vector<std::string>{"GPU", "CPU"}));
  EXPECT_EQ(ans.by_medium[b], (std::vector<size_t>{0, 2}));
  EXPECT_EQ(ans.by_medium[a], (std::vector<size_t>{1, 0}));
  EXPECT_FALSE(core.route({1, 2, 3}).best) << "no instance holds anything of it";
}

TEST(RouterCore, CatchUpAtStartThenLiveDuplicatesAreNotARestart) {
  Core core(0, 4);
  size_t a = core.add_instance("a");
  const std::string s1 = batch(1, [](Packer &p) { stored(p, {1}, "GPU"); });
  const std::string s2 = batch(1, [](Packer &p) { stored(p, {2}, "GPU"); });
  ASSERT_EQ(core.catch_up(a), 0u);
  core.deliver_replayed(a, 0, s1);
  core.deliver_replayed(a, 1, s2);
  core.caught_up(a);
  // Sent live while the catch-up replayed them: already applied.
  for (uint64_t seq : {0, 1}) {
    std::vector<std::string> m{"", seq_frame(seq), seq ? s2 : s1};
    EXPECT_EQ(core.deliver(a, {m.begin(), m.end()}), std::nullopt);
  }
  std::vector<std::string> m{"", seq_frame(2), s1};
  EXPECT_EQ(core.deliver(a, {m.begin(), m.end()}), std::nullopt);
  StreamStats st = core.stats(a);
  EXPECT_EQ(st.replayed, 2u);
  EXPECT_EQ(st.duplicates, 2u);
  EXPECT_EQ(st.restarts, 0u);
  EXPECT_EQ(st.last_seq, 2u);
  EXPECT_EQ(core.catch_up(a), std::nullopt) << "only before anything was delivered";
  // A publisher that really restarts afterwards is still told apart.
  std::vector<std::string> r{"", seq_frame(0), s1};
  EXPECT_EQ(core.deliver(a, {r.begin(), r.end()}), std::nullopt);
  EXPECT_EQ(core.stats(a).restarts, 1u);
}

TEST(RouterCore, ResyncOfAQuietInstanceAppliesWhatFollows) {
  Core core(0, 4);
  size_t a = core.add_instance("a");
  const std::string s1 = batch(1, [](Packer &p) { stored(p, {1}, "GPU"); });
  const std::string s2 = batch(1, [](Packer &p) { removed(p, {1}, "GPU"); });
  std::vector<std::string> m{"", seq_frame(0), s1};
  ASSERT_EQ(core.deliver(a, {m.begin(), m.end()}), std::nullopt);
  // Message 1 never came live, and nothing after it shows it missing.
  EXPECT_EQ(core.resync(a), 1u);
  core.deliver_replayed(a, 0, s1);
  core.deliver_replayed(a, 1, s2);
  StreamStats st = core.stats(a);
  EXPECT_EQ(st.last_seq, 1u);
  EXPECT_EQ(st.replayed, 1u);
  EXPECT_EQ(st.duplicates, 1u);
  EXPECT_EQ(core.route_hashes({1}).overlap[0], 0u) << "the removal was applied";
}

// A snapshot after a gap replay could not fill: the index becomes the snapshot's, whatever
// it held; live messages numbered before the snapshot's are duplicates, not a restart.
TEST(RouterCore, ASnapshotReplacesAStaleIndexAndTheStreamGoesOnFromItsNumber) {
  Core core(0, 4);
  size_t a = core.add_instance("a");
  auto deliver = [&](uint64_t seq, const std::string &payload) {
    std::vector<std::string> m{"", seq_frame(seq), payload};
    return core.deliver(a, {m.begin(), m.end()});
  };
  const std::string s1 = batch(1, [](Packer &p) { stored(p, {1}, "GPU"); });
  const std::string s9 = batch(1, [](Packer &p) { stored(p, {9}, "GPU"); });
  EXPECT_EQ(deliver(0, s1), std::nullopt);
  EXPECT_EQ(deliver(4, s9), 1u);  // 1..3 missed, and the replay buffer no longer has them
  core.replay_missed(a);
  EXPECT_TRUE(core.stale(a));
  EXPECT_EQ(core.stats(a).lost, 3u);
  // The snapshot, numbered 6: the instance then held 2 (GPU) and 3 (CPU), no longer 1.
  core.deliver_snapshot(a, batch(2, [](Packer &p) {
                          p.pack_array(1);
                          p.pack(std::string("AllBlocksCleared"));
                          stored(p, {2}, "GPU");
                        }));
  core.deliver_snapshot(a, batch(1, [](Packer &p) { stored(p, {3}, "CPU"); }));
  core.end_snapshot(a, 6);
  EXPECT_FALSE(core.stale(a));
  EXPECT_EQ(core.hashes(a, std::nullopt), (std::vector<uint64_t>{2, 3}));
  StreamStats st = core.stats(a);
  EXPECT_EQ(st.snapshots, 1u);
  EXPECT_EQ(st.last_seq, 5u);
  // 4 and 5 were queued live before the snapshot: already in it.
  EXPECT_EQ(deliver(4, s9), std::nullopt);
  EXPECT_EQ(deliver(5, s9), std::nullopt);
  EXPECT_EQ(deliver(6, s1), std::nullopt);
  st = core.stats(a);
  EXPECT_EQ(st.duplicates, 2u);
  EXPECT_EQ(st.restarts, 0u);
  EXPECT_EQ(st.last_seq, 6u);
  EXPECT_EQ(core.hashes(a, std::nullopt), (std::vector<uint64_t>{1, 2, 3}));
  // A snapshot with a bad message leaves the index stale.
  core.deliver_snapshot(a, "\xc1");
  core.end_snapshot(a, 7);
  EXPECT_TRUE(core.stale(a));
  EXPECT_EQ(core.stats(a).bad, 1u);
}
