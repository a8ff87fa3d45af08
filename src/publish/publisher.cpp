#include "publish/publisher.hpp"

#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <exception>

#include "common/error.hpp"
#include "common/log.hpp"

namespace kvt::pub {
namespace {

constexpr int kHwm = 100000;              // vLLM's default high-water mark
constexpr int kMaxRequestBytes = 256;     // a replay request is 8 bytes; bigger ones disconnect
constexpr int kRequestsPerWake = 16;      // replays served between two event batches
constexpr unsigned char kEndSeq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};  // -1

void put_be64(unsigned char *p, uint64_t v) noexcept {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<unsigned char>(v);
}
uint64_t get_be64(const unsigned char *p) noexcept {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}

kvt_status zmq_fail(const char *field, const std::string &endpoint, const char *op) {
  int e = zmq_errno();
  bool bad = e == EINVAL || e == EPROTONOSUPPORT || e == ENOCOMPATPROTO;
  return fail(bad ? KVT_ERR_INVALID_ARGUMENT : KVT_ERR_IO, "%s \"%s\": ZMQ cannot %s it: %s",
              field, endpoint.c_str(), op, zmq_strerror(e));
}

bool set_int(void *socket, int option, int value) {
  return zmq_setsockopt(socket, option, &value, sizeof value) == 0;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

bool binds(const std::string &e) noexcept {
  return e.find('*') != std::string::npos || e.find("::") != std::string::npos ||
         e.rfind("ipc://", 0) == 0 || e.rfind("inproc://", 0) == 0;
}

Publisher::Publisher(const PublisherConfig &c)
    : cfg_(c),
      memo_(c.memo_blocks, c.page_size),
      encoder_(c.page_size, c.dp_rank, c.tiers, c.format) {}

kvt_status Publisher::create(std::unique_ptr<Publisher> *out, const PublisherConfig &c) {
  std::unique_ptr<Publisher> p(new Publisher(c));
  p->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (p->wake_fd_ < 0)
    return fail(KVT_ERR_IO, "kv_events_endpoint: no eventfd for the publisher: %s",
                strerror(errno));
  if ((p->ctx_ = zmq_ctx_new()) == nullptr)
    return fail(KVT_ERR_IO, "kv_events_endpoint: no ZMQ context: %s", zmq_strerror(zmq_errno()));
  if ((p->pub_ = zmq_socket(p->ctx_, ZMQ_PUB)) == nullptr ||
      !set_int(p->pub_, ZMQ_SNDHWM, kHwm) || !set_int(p->pub_, ZMQ_LINGER, kLingerMs))
    return zmq_fail("kv_events_endpoint", c.endpoint, "open a PUB socket for");
  if (binds(c.endpoint) ? zmq_bind(p->pub_, c.endpoint.c_str()) != 0
                        : zmq_connect(p->pub_, c.endpoint.c_str()) != 0)
    return zmq_fail("kv_events_endpoint", c.endpoint, binds(c.endpoint) ? "bind" : "connect");
  if (!c.replay_endpoint.empty()) {
    if ((p->router_ = zmq_socket(p->ctx_, ZMQ_ROUTER)) == nullptr ||
        !set_int(p->router_, ZMQ_LINGER, 0))
      return zmq_fail("kv_events_replay_endpoint", c.replay_endpoint, "open a ROUTER socket for");
    int64_t max_bytes = kMaxRequestBytes;
    if (zmq_setsockopt(p->router_, ZMQ_MAXMSGSIZE, &max_bytes, sizeof max_bytes) != 0 ||
        zmq_bind(p->router_, c.replay_endpoint.c_str()) != 0)
      return zmq_fail("kv_events_replay_endpoint", c.replay_endpoint, "bind");
  }
  p->thread_ = std::thread(&Publisher::run, p.get());
  *out = std::move(p);
  return KVT_OK;
}

Publisher::~Publisher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  if (thread_.joinable()) {
    wake();
    thread_.join();
  }
  if (router_) zmq_close(router_);
  if (pub_) zmq_close(pub_);
  if (ctx_) zmq_ctx_term(ctx_);  // waits up to kLingerMs for the last messages to leave
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Publisher::wake() noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);  // full counter: awake anyway
}

void Publisher::note_tokens(const uint64_t *seq_hashes, size_t n,
                            const uint32_t *tokens) noexcept {
  for (size_t i = 0; i < n; ++i) memo_.note(seq_hashes[i], tokens + i * cfg_.page_size);
}

void Publisher::drop_pending() noexcept {
  for (const QueuedEvent &q : pending_)
    if (q.held) memo_.take(q.hash, true, nullptr);
  pending_.clear();
  ++dropped_;
}

void Publisher::publish(const kvt_event *events, size_t n) noexcept {
  std::lock_guard lock(mu_);
  const bool was_idle = pending_.empty() && dropped_ == 0;
  for (size_t i = 0; i < n; ++i) {
    const kvt_event &e = events[i];
    // Every tier's blocks count for the memo: a block one tier holds may be published in
    // another (offloaded, onboarded).
    const bool published = cfg_.tiers & (1u << e.tier);
    bool held = false;
    if (e.type == KVT_EVENT_BLOCK_STORED) held = memo_.stored(e.hash, e.tier, published);
    else if (e.type == KVT_EVENT_BLOCK_REMOVED) memo_.removed(e.hash, e.tier);
    if (!published) continue;
    // The thread is far behind, or memory is short: a batch is lost, visibly (a skipped seq).
    if (pending_.size() >= kMaxPending) drop_pending();
    try {
      pending_.push_back(
          QueuedEvent{e.hash, e.parent_hash, uint8_t(e.type), uint8_t(e.tier), held});
    } catch (...) {
      if (held) memo_.take(e.hash, true, nullptr);
      drop_pending();
    }
  }
  if (was_idle && armed_ && (!pending_.empty() || dropped_)) {
    armed_ = false;
    wake();
  }
}

void Publisher::run() noexcept {
  std::vector<QueuedEvent> batch;
  zmq_pollitem_t items[2] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0},
                             {router_, 0, ZMQ_POLLIN, 0}};
  for (;;) {
    uint64_t skipped;
    bool stopping;
    {
      std::lock_guard lock(mu_);
      batch.clear();
      batch.swap(pending_);
      skipped = dropped_;
      dropped_ = 0;
      stopping = stop_;
      armed_ = batch.empty() && skipped == 0 && !stopping;
    }
    bool idle = batch.empty() && skipped == 0;
    try {
      if (skipped) {
        log(KVT_LOG_WARN,
            "kv events: the publisher fell behind and dropped %llu batch(es): sequence "
            "number(s) from %llu are skipped",
            (unsigned long long)skipped, (unsigned long long)seq_);
        seq_ += skipped;
      }
      if (!batch.empty()) send_batch(batch);
      if (router_ && serve_replay()) idle = false;
    } catch (const std::exception &e) {
      log(KVT_LOG_ERROR, "kv events: batch %llu not sent: %s", (unsigned long long)seq_,
          e.what());
    }
    if (!idle) continue;  // more may have come meanwhile
    if (stopping) return;
    if (zmq_poll(items, router_ ? 2 : 1, -1) > 0 && items[0].revents) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof v);
    }
  }
}

void Publisher::send_batch(const std::vector<QueuedEvent> &events) {
  const size_t n = encoder_.encode(events, now_seconds(), memo_, &payload_);
  if (uint64_t unknown = encoder_.unknown_tokens()) {
    // Logged at the 1st, 2nd, 4th, 8th... such block: visible, never a flood.
    const uint64_t before = unknown_tokens_;
    unknown_tokens_ += unknown;
    if (std::bit_width(before) != std::bit_width(unknown_tokens_))
      log(KVT_LOG_WARN,
          "kv events: %llu stored block(s) so far published with an empty token_ids: no "
          "tokens were noted for their hashes (kvt_manager_note_tokens before registering "
          "a block by hash)",
          (unsigned long long)unknown_tokens_);
  }
  if (n == 0) return;
  unsigned char seq[8];
  put_be64(seq, seq_);
  // PUB never blocks: a subscriber at its high-water mark misses the message (a gap).
  zmq_send(pub_, cfg_.topic.data(), cfg_.topic.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, payload_.data(), payload_.size(), ZMQ_DONTWAIT);
  if (router_) {  // kept only where a replay can ask for it
    if (replay_.size() == cfg_.buffer) replay_.pop_front();
    replay_.emplace_back(seq_, payload_);
  }
  ++seq_;
}

// vLLM's replay protocol: a request is [identity, empty, start seq (8 bytes big-endian)];
// the answer is [identity, empty, topic, seq, payload] for each kept batch from start on,
// then [identity, empty, empty, -1 (8 bytes), empty] (vLLM 0.10/0.11, the old format:
// [identity, empty, seq, payload], then [identity, empty, -1, empty]). A request of another
// shape is ignored.
bool Publisher::serve_replay() {
  const bool with_topic = cfg_.format == KVT_KV_EVENTS_FORMAT_CURRENT;
  for (int r = 0; r < kRequestsPerWake; ++r) {
    std::string frames[3];
    size_t count = 0;
    for (bool more = true; more; ++count) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, router_, ZMQ_DONTWAIT) < 0) {  // none waiting
        zmq_msg_close(&m);
        if (count == 0) return false;
        break;
      }
      if (count < 3) frames[count].assign(static_cast<const char *>(zmq_msg_data(&m)),
                                          zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (count != 3 || frames[2].size() != 8) {
      log(KVT_LOG_WARN,
          "kv events: ignored a replay request of %zu frame(s) (want 3: identity, empty, the "
          "start sequence number as 8 bytes big-endian)",
          count);
      continue;
    }
    const uint64_t start = get_be64(reinterpret_cast<const unsigned char *>(frames[2].data()));
    const std::string &id = frames[0];
    auto reply = [&](const std::string &topic_frame, const void *seq, const std::string &payload) {
      zmq_send(router_, id.data(), id.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(router_, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
      if (with_topic)
        zmq_send(router_, topic_frame.data(), topic_frame.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(router_, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(router_, payload.data(), payload.size(), ZMQ_DONTWAIT);
    };
    for (const auto &[seq, payload] : replay_) {
      if (seq < start) continue;
      unsigned char be[8];
      put_be64(be, seq);
      reply(cfg_.topic, be, payload);
    }
    reply(std::string(), kEndSeq, std::string());
  }
  return true;  // more requests may wait
}

}  // namespace kvt::pub
