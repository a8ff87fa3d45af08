#include "kv_events/publisher.hpp"

#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <exception>

#include "common/error.hpp"
#include "common/log.hpp"
#include "kv_events/chain_order.hpp"
#include "kv_events/replay_request.hpp"

namespace kvt::pub {
namespace {

constexpr int kMaxRequestBytes = 256;     // a replay request is 8 bytes; bigger ones disconnect
constexpr int kRequestsPerWake = 16;      // replays served between two event batches
constexpr uint64_t kEndSeq = ~uint64_t{0};  // vLLM's END_SEQ, -1 as 8 signed bytes

kvt_status zmq_fail(const char *field, const std::string &endpoint, const char *op) {
  int e = zmq_errno();
  bool bad = e == EINVAL || e == EPROTONOSUPPORT || e == ENOCOMPATPROTO;
  return fail(bad ? KVT_ERR_INVALID_ARGUMENT : KVT_ERR_IO, "%s \"%s\": ZMQ cannot %s it: %s",
              field, endpoint.c_str(), op, zmq_strerror(e));
}

bool set_int(void *socket, int option, int value) {
  return zmq_setsockopt(socket, option, &value, sizeof value) == 0;
}

bool set_heartbeat(void *socket) {
  return set_int(socket, ZMQ_HEARTBEAT_IVL, kHeartbeatIvlMs) &&
         set_int(socket, ZMQ_HEARTBEAT_TIMEOUT, kHeartbeatTimeoutMs);
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
      !set_int(p->pub_, ZMQ_SNDHWM, kSendHwm) || !set_int(p->pub_, ZMQ_LINGER, kLingerMs) ||
      !set_heartbeat(p->pub_))
    return zmq_fail("kv_events_endpoint", c.endpoint, "open a PUB socket for");
  if (binds(c.endpoint) ? zmq_bind(p->pub_, c.endpoint.c_str()) != 0
                        : zmq_connect(p->pub_, c.endpoint.c_str()) != 0)
    return zmq_fail("kv_events_endpoint", c.endpoint, binds(c.endpoint) ? "bind" : "connect");
  if (!c.replay_endpoint.empty()) {
    // No high-water mark: the budgets bound what each client's pipe holds (counting every
    // message), and a reply cut by a full pipe would lose its END_SEQ.
    if ((p->router_ = zmq_socket(p->ctx_, ZMQ_ROUTER)) == nullptr ||
        !set_int(p->router_, ZMQ_LINGER, 0) || !set_int(p->router_, ZMQ_SNDHWM, 0) ||
        !set_heartbeat(p->router_))
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
  gather_.notify_all();
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
  // The PUB socket acts on ZMQ's commands (a subscriber gone: free what its queue held)
  // only inside a call on it; its ZMQ_FD says when some wait, for a thread that may send
  // nothing for a long time (the budget is held, or no events come).
  int pub_fd = -1;
  size_t fd_size = sizeof pub_fd;
  zmq_getsockopt(pub_, ZMQ_FD, &pub_fd, &fd_size);
  zmq_pollitem_t items[3] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0},
                             {nullptr, pub_fd, ZMQ_POLLIN, 0},
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
    // A kept snapshot is let go once its period is over, even with nothing else to do.
    if (!snapshot_messages_.empty() &&
        std::chrono::steady_clock::now() - snapshot_at_ >= kSnapshotReuse)
      snapshot_messages_.clear();
    const long wait_ms = snapshot_messages_.empty() ? -1 : 100;
    if (zmq_poll(items, router_ ? 3 : 2, wait_ms) <= 0) continue;
    if (items[0].revents) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof v);
      std::unique_lock lock(mu_);
      gather_.wait_for(lock, kGatherWindow, [&] { return stop_; });
    }
    if (items[1].revents) {
      int events;
      size_t size = sizeof events;
      zmq_getsockopt(pub_, ZMQ_EVENTS, &events, &size);  // runs the commands
    }
  }
}

void Publisher::send_batch(const std::vector<QueuedEvent> &events) {
  const size_t n = encoder_.encode(events, now_seconds(), &memo_, &payload_);
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
  auto batch = std::make_shared<const std::string>(std::move(payload_));
  payload_.clear();  // moved from: the next batch is encoded into it again
  send_pub(batch);
  if (router_) {  // kept only where a replay can ask for it
    ReplayLedger &l = *ledger_;
    if (replay_.size() == cfg_.buffer) {
      l.kept_cost.fetch_sub(message_cost(*replay_.front().second), std::memory_order_relaxed);
      replay_.pop_front();
    }
    l.kept_cost.fetch_add(message_cost(*batch), std::memory_order_relaxed);
    replay_.emplace_back(seq_, std::move(batch));
    l.kept_batches.store(replay_.size(), std::memory_order_relaxed);
  }
  ++seq_;
}

namespace {

// One PUB message's hold on its batch, from zmq_msg_init_data until ZMQ frees the message.
struct SendLease {
  std::shared_ptr<const std::string> batch;
  std::shared_ptr<SendLedger> ledger;
  uint64_t cost = 0;
  std::atomic<bool> handed{false};  // as Lease::handed below
};

void free_send_lease(void *, void *hint) noexcept {
  auto *lease = static_cast<SendLease *>(hint);
  [[maybe_unused]] bool handed = lease->handed.load(std::memory_order_acquire);
  lease->ledger->bytes.fetch_sub(lease->cost, std::memory_order_relaxed);
  delete lease;
}

// One reply message's hold on its batch (shared, never copied) and its reply, from
// zmq_msg_init_data until ZMQ frees the message.
struct Lease {
  std::shared_ptr<const std::string> batch;  // null: END_SEQ's empty payload
  std::shared_ptr<ReplayReply> reply;
  uint64_t cost = 0;
  // Stored before the message goes to ZMQ, loaded when it is freed: libzmq's queues are
  // invisible to TSan, and this pair makes the hand-over one it sees.
  std::atomic<bool> handed{false};
};

// ZMQ's free callback, on its I/O thread (or the sender's, for a message dropped at once).
void free_lease(void *, void *hint) noexcept {
  auto *lease = static_cast<Lease *>(hint);
  [[maybe_unused]] bool handed = lease->handed.load(std::memory_order_acquire);
  ReplayClient &c = *lease->reply->client;
  c.bytes.fetch_sub(lease->cost, std::memory_order_relaxed);
  c.ledger->bytes.fetch_sub(lease->cost, std::memory_order_relaxed);
  delete lease;
}

void raise_peak(std::atomic<uint64_t> &peak, uint64_t v) noexcept {  // one writer
  if (v > peak.load(std::memory_order_relaxed)) peak.store(v, std::memory_order_relaxed);
}

}  // namespace

// PUB never blocks: a subscriber at its high-water mark misses the message (a gap), and so
// do all while the budget is held. One batch goes while nothing is held, however big.
void Publisher::send_pub(const std::shared_ptr<const std::string> &batch) {
  SendLedger &l = *sent_;
  const uint64_t cost = batch->size() + cfg_.topic.size() + kSendMessageOverhead;
  const uint64_t held = l.bytes.load(std::memory_order_relaxed);
  if (held != 0 && cost > kSendBudgetBytes - std::min(held, kSendBudgetBytes)) {
    if (bump_and_tell(&l.skipped))
      log(KVT_LOG_WARN,
          "kv events: %llu batch(es) not published so far (this one is seq %llu): "
          "subscribers that do not read hold %llu bytes, the most they may",
          (unsigned long long)l.skipped.load(std::memory_order_relaxed),
          (unsigned long long)seq_, (unsigned long long)held);
    return;
  }
  auto *lease = new SendLease{batch, sent_, cost};
  raise_peak(l.peak_bytes, l.bytes.fetch_add(cost, std::memory_order_relaxed) + cost);
  lease->handed.store(true, std::memory_order_release);
  zmq_msg_t m;
  if (zmq_msg_init_data(&m, const_cast<char *>(batch->data()), batch->size(), free_send_lease,
                        lease) != 0) {
    free_send_lease(nullptr, lease);
    return;
  }
  unsigned char seq[8];
  put_be64(seq, seq_);
  zmq_send(pub_, cfg_.topic.data(), cfg_.topic.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  if (zmq_msg_send(&m, pub_, ZMQ_DONTWAIT) < 0) zmq_msg_close(&m);  // frees the lease
  l.sent.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Publisher::message_cost(const std::string &payload) const noexcept {
  const bool with_topic = cfg_.format == KVT_KV_EVENTS_FORMAT_CURRENT;
  return payload.size() + (with_topic ? cfg_.topic.size() : 0) + kReplayMessageOverhead;
}

bool Publisher::bump_and_tell(std::atomic<uint64_t> *count) noexcept {
  const uint64_t before = count->fetch_add(1, std::memory_order_relaxed);
  return std::bit_width(before) != std::bit_width(before + 1);
}

// vLLM's replay protocol: a request is [identity, empty, start seq (8 bytes big-endian)];
// the answer is [identity, empty, topic, seq, payload] for each kept batch from start on,
// then [identity, empty, empty, -1 (8 bytes), empty] (vLLM 0.10/0.11, the old format:
// [identity, empty, seq, payload], then [identity, empty, -1, empty]). A request of another
// shape is ignored.
bool Publisher::serve_replay() {
  ReplayLedger &l = *ledger_;
  for (int r = 0; r < kRequestsPerWake; ++r) {
    std::string frames[kReplayRequestFrames];
    size_t count = 0;
    for (bool more = true; more; ++count) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, router_, ZMQ_DONTWAIT) < 0) {  // none waiting
        zmq_msg_close(&m);
        if (count == 0) return false;
        break;
      }
      if (count < kReplayRequestFrames)
        frames[count].assign(static_cast<const char *>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    const std::string_view views[kReplayRequestFrames] = {frames[0], frames[1], frames[2]};
    const ReplayRequest q = parse_replay_request(views, count);
    if (q.ok && q.snapshot) {
      answer_snapshot(views[0]);
    } else if (q.ok) {
      answer(views[0], q.start);
    } else if (bump_and_tell(&l.malformed)) {
      log(KVT_LOG_WARN,
          "kv events: %llu replay request(s) ignored so far; this one of %zu frame(s) had %s",
          (unsigned long long)l.malformed.load(std::memory_order_relaxed), count, q.why);
    }
    l.requests.fetch_add(1, std::memory_order_release);  // after its outcome is counted
  }
  return true;  // more requests may wait
}

std::shared_ptr<ReplayClient> Publisher::admit(std::string_view id, uint64_t client_budget,
                                               uint64_t *room) {
  ReplayLedger &l = *ledger_;
  if (clients_.size() >= sweep_at_) {
    std::erase_if(clients_, [](const auto &kv) { return kv.second.expired(); });
    sweep_at_ = std::max<size_t>(64, 2 * clients_.size());
  }
  std::weak_ptr<ReplayClient> &entry = clients_[std::string(id)];
  std::shared_ptr<ReplayClient> client = entry.lock();
  if (!client) entry = client = std::make_shared<ReplayClient>(ledger_);
  // Others only ever lower these two while we read them: the room is never overstated.
  const uint64_t client_bytes = client->bytes.load(std::memory_order_relaxed);
  const uint64_t total_bytes = l.bytes.load(std::memory_order_relaxed);
  const uint64_t total_budget = l.total_budget();
  *room = std::min(client_budget - std::min(client_budget, client_bytes),
                   total_budget - std::min(total_budget, total_bytes));
  const bool busy = client->replies.load(std::memory_order_acquire) >= kMaxRepliesPerClient;
  if (busy || *room < kReplayMessageOverhead) {
    if (bump_and_tell(&l.dropped))
      log(KVT_LOG_WARN,
          "kv events: %llu replay request(s) dropped so far, unanswered: this client has %s "
          "(a client may hold %u replies and %llu bytes, all clients %llu bytes)",
          (unsigned long long)l.dropped.load(std::memory_order_relaxed),
          busy ? "replies in flight it has not read" : "its budget in flight",
          kMaxRepliesPerClient, (unsigned long long)client_budget,
          (unsigned long long)total_budget);
    return nullptr;
  }
  *room -= kReplayMessageOverhead;  // END_SEQ's, kept for it
  return client;
}

// Sends the kept batches from `start` on, as many as the client's and the total budget
// leave room for (a client that does not read keeps its replies in flight), then END_SEQ;
// without room for END_SEQ, or with kMaxRepliesPerClient replies in flight, nothing.
void Publisher::answer(std::string_view id, uint64_t start) {
  ReplayLedger &l = *ledger_;
  const uint64_t client_budget = l.client_budget(), total_budget = l.total_budget();
  uint64_t room = 0;
  std::shared_ptr<ReplayClient> client = admit(id, client_budget, &room);
  if (!client) return;
  auto reply = std::make_shared<ReplayReply>(client);
  auto it = std::lower_bound(replay_.begin(), replay_.end(), start,
                             [](const auto &kept, uint64_t s) { return kept.first < s; });
  bool cut = false;
  for (; it != replay_.end(); ++it) {
    const uint64_t cost = message_cost(*it->second);
    if (cost > room) {
      cut = true;
      break;
    }
    room -= cost;
    send_reply(id, it->first, it->second, reply, cost);
  }
  send_reply(id, kEndSeq, nullptr, reply, kReplayMessageOverhead);
  if (!cut) {
    l.full.fetch_add(1, std::memory_order_relaxed);
  } else if (bump_and_tell(&l.cut)) {
    log(KVT_LOG_WARN,
        "kv events: %llu replay(s) cut short so far: this one ends at seq %llu, before its "
        "client's budget of %llu bytes in flight (all clients %llu) ran out",
        (unsigned long long)l.cut.load(std::memory_order_relaxed),
        (unsigned long long)it->first, (unsigned long long)client_budget,
        (unsigned long long)total_budget);
  }
}

void Publisher::set_snapshot_source(SnapshotSource source) {
  std::lock_guard lock(snapshot_mu_);
  snapshot_ = std::move(source);
}

// The snapshot of the last kSnapshotReuse, or a new one, then END_SEQ. All or nothing: a
// snapshot that does not fit in the client's room is answered with END_SEQ alone.
void Publisher::answer_snapshot(std::string_view id) {
  ReplayLedger &l = *ledger_;
  const uint64_t client_budget = std::max(kSnapshotClientBytesMin, l.client_budget());
  uint64_t room = 0;
  std::shared_ptr<ReplayClient> client = admit(id, client_budget, &room);
  if (!client) return;
  auto reply = std::make_shared<ReplayReply>(client);
  const auto now = std::chrono::steady_clock::now();
  // Reused while a consumer can replay what followed it.
  const bool held = seq_ == snapshot_next_ ||
                    (!replay_.empty() && replay_.front().first <= snapshot_next_);
  if (now - snapshot_at_ >= kSnapshotReuse || !held) {
    snapshot_messages_.clear();  // before the next is built: one in memory at a time
    snapshot_cost_ = take_snapshot(&snapshot_messages_, &snapshot_next_, l.total_budget());
    snapshot_at_ = now;
  }
  if (snapshot_cost_ > room) {
    if (bump_and_tell(&l.snapshots_refused))
      log(KVT_LOG_WARN,
          "kv events: %llu snapshot request(s) answered with END_SEQ alone so far: this "
          "one needs more than the %llu bytes its client may have in flight",
          (unsigned long long)l.snapshots_refused.load(std::memory_order_relaxed),
          (unsigned long long)room);
  } else {
    for (const auto &[m, c] : snapshot_messages_) send_reply(id, snapshot_next_, m, reply, c);
    l.snapshots.fetch_add(1, std::memory_order_relaxed);
  }
  send_reply(id, kEndSeq, nullptr, reply, kReplayMessageOverhead);
}

// Every block of the published tiers now, as messages of kSnapshotBlocksPerBatch blocks,
// the first beginning with AllBlocksCleared (alone when the tiers hold none), to be
// numbered with the seq of the next batch to be published (*next). The blocks are read
// after that number is fixed, so that applying the batches from it on over the snapshot
// gives the instance's registry, even as it changes meanwhile (docs/KV_EVENTS.md,
// Snapshots). Returns their cost; past limit, none are kept and the cost is over it.
uint64_t Publisher::take_snapshot(Messages *out, uint64_t *next, uint64_t limit) {
  *next = seq_;
  std::vector<QueuedEvent> events;
  for (unsigned t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
    if (cfg_.tiers & (1u << t))
      events.push_back(QueuedEvent{0, 0, uint8_t(KVT_EVENT_TIER_CLEARED), uint8_t(t), false});
  const size_t clears = events.size();
  {
    std::lock_guard lock(snapshot_mu_);
    if (snapshot_) snapshot_(&events);
  }
  for (size_t i = clears, j; i < events.size(); i = j) {  // each tier's blocks
    for (j = i + 1; j < events.size() && events[j].tier == events[i].tier;) ++j;
    order_chains(events.data() + i, j - i);
  }
  BatchEncoder encoder(cfg_.page_size, cfg_.dp_rank, cfg_.tiers, cfg_.format);
  std::vector<QueuedEvent> part;
  const double ts = now_seconds();
  uint64_t total = 0;
  for (size_t i = 0; i < events.size() && total <= limit;) {
    const size_t end = std::min(events.size(), (i == 0 ? clears : i) + kSnapshotBlocksPerBatch);
    part.assign(events.begin() + i, events.begin() + end);
    i = end;
    std::string payload;
    if (encoder.encode(part, ts, nullptr, &payload) == 0) continue;
    auto m = std::make_shared<const std::string>(std::move(payload));
    const uint64_t cost = message_cost(*m);
    total += cost;
    out->emplace_back(std::move(m), cost);
  }
  if (total > limit) out->clear();
  return total;
}

// One message of a reply: the batch goes zero-copy, and its cost counts as in flight from
// here until ZMQ frees it. A message ZMQ drops (its client is gone) is freed as well.
void Publisher::send_reply(std::string_view id, uint64_t seq,
                           std::shared_ptr<const std::string> batch,
                           const std::shared_ptr<ReplayReply> &reply, uint64_t cost) {
  const bool end = seq == kEndSeq;
  char *data = batch ? const_cast<char *>(batch->data()) : nullptr;
  const size_t size = batch ? batch->size() : 0;
  auto *lease = new Lease{std::move(batch), reply, cost};
  ReplayClient &c = *reply->client;
  raise_peak(ledger_->peak_client_bytes, c.bytes.fetch_add(cost, std::memory_order_relaxed) + cost);
  raise_peak(ledger_->peak_bytes, ledger_->bytes.fetch_add(cost, std::memory_order_relaxed) + cost);
  lease->handed.store(true, std::memory_order_release);  // this thread's last touch of it
  zmq_msg_t m;
  if (zmq_msg_init_data(&m, data, size, free_lease, lease) != 0) {
    free_lease(nullptr, lease);
    return;
  }
  unsigned char be[8];
  put_be64(be, seq);
  // The ROUTER never blocks: a frame for a client that is gone is dropped (and freed).
  zmq_send(router_, id.data(), id.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(router_, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  if (cfg_.format == KVT_KV_EVENTS_FORMAT_CURRENT)
    zmq_send(router_, cfg_.topic.data(), end ? 0 : cfg_.topic.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(router_, be, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  if (zmq_msg_send(&m, router_, ZMQ_DONTWAIT) < 0) zmq_msg_close(&m);  // frees the lease
}

}  // namespace kvt::pub
