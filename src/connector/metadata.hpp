// What passes between the connector's halves: the scheduler's metadata of one step (loads
// and stores to run) and the worker's report (what ended). Both encode to msgpack bytes in
// the versioned format of docs/CONNECTOR.md, so that the halves can live in two processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier.h"

namespace kvt::conn {

// 2 (0.5.0): the shape has the world's size, and a report its rank.
inline constexpr uint32_t kFormatVersion = 2;

// What both halves must agree on; a message from a connector with another is refused.
struct Shape {
  uint32_t page_size = 0;
  uint64_t g2_blocks = 0, g3_blocks = 0;
  uint32_t world_size = 1;  // workers of the scheduler half, each with its shard of a block
  bool operator==(const Shape &) const = default;
};

// One block copied between an engine G1 block and a G2 or G3 slot.
struct CopyOp {
  uint32_t g1 = 0;     // the engine's block id
  uint8_t tier = 0;    // KVT_TIER_G2 or KVT_TIER_G3: the other side
  uint32_t slot = 0;   // slot in that tier
  uint64_t hash = 0;   // sequence hash: G3 writes it into the slot's header, reads check it
  uint64_t parent = 0;
  bool operator==(const CopyOp &) const = default;
};

// All the loads of one request in one step (G2/G3 -> G1), or all the stores of one request
// in one step (G1 -> G2/G3). A batch is acknowledged as a whole once all its copies ended.
struct Batch {
  uint64_t id = 0;      // unique per connector and direction
  std::string req_id;
  std::vector<CopyOp> ops;
  bool operator==(const Batch &) const = default;
};

struct Meta {
  Shape shape;
  uint64_t step = 0;
  bool async_load = false;
  std::vector<Batch> lazy_stores;   // run first: their G1 blocks are about to be overwritten
  std::vector<Batch> loads;
  std::vector<Batch> stores;        // eager: after the step's forward
  std::vector<std::string> finished;  // finished requests the worker reports in
                                      // finished_sending once their batches drained
  bool operator==(const Meta &) const = default;
};

// A copy of a batch that failed, and why.
struct Failure {
  uint32_t op = 0;          // index into the batch's ops
  kvt_status status = 0;    // KVT_ERR_CORRUPT (checksum), KVT_ERR_IO, ...
  bool operator==(const Failure &) const = default;
};

struct Done {
  uint64_t id = 0;
  std::vector<Failure> failed;
  bool operator==(const Done &) const = default;
};

struct Report {
  Shape shape;
  uint32_t rank = 0;                        // the worker's, below shape.world_size
  std::vector<Done> loads, stores;          // batches that ended
  std::vector<std::string> finished_sending;
  std::vector<std::string> finished_recving;
  bool operator==(const Report &) const = default;
};

// Encoders never fail. Decoders return KVT_OK, or KVT_ERR_CORRUPT with a message naming what
// is wrong (truncated, trailing bytes, not msgpack, another magic or format version, a field
// of the wrong type or out of range, with its path: "loads[2].ops[0].slot"); then *out is
// unchanged. Any bytes are safe: no crash, no exception, memory within a small multiple of
// len (KVT_ERR_NO_MEMORY only if even that fails; KVT_ERR_INVALID_ARGUMENT for NULL bytes
// with len > 0). They check the message's own consistency only: in a decoded message every
// op's tier is G2 or G3 and its slot below the message's own shape's capacity of that tier,
// every request id is 1..KVT_REQ_ID_MAX bytes without NUL, every failure's status is
// negative, the world's size 1..KVT_MAX_WORLD_SIZE and a report's rank below it. The caller compares the shape with its own and checks G1 block ids and batch
// ids.
std::string encode(const Meta &m);
std::string encode(const Report &r);
kvt_status decode(Meta *out, const void *bytes, size_t len);
kvt_status decode(Report *out, const void *bytes, size_t len);

}  // namespace kvt::conn
