// kvtier-console PATH: a terminal view of a running kvtier (kvt_endpoint_open, kvtier-replay
// --console-socket): the live slots with their state and age, the batches in flight, the
// tiers' occupancy, and the timeline of the selected request; keys pause, resume and set
// breakpoints. It refreshes five times a second over the endpoint's JSON lines; the
// timeline is the endpoint's record of the selected request's last events.
#include <curses.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

using nlohmann::json;

namespace {

// One connection to the endpoint, with a line buffer.
class Conn {
 public:
  bool open(const std::string &path) {
    sockaddr_un a{};
    if (path.size() >= sizeof a.sun_path) return false;
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size());
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    return fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
  }
  ~Conn() {
    if (fd_ >= 0) close(fd_);
  }
  bool send(const json &req) {
    std::string s = req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size());
  }
  // The next line within timeout_ms; false on timeout or a closed connection.
  bool line(std::string *out, int timeout_ms) {
    for (;;) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        *out = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return false;
      char b[65536];
      ssize_t n = read(fd_, b, sizeof b);
      if (n <= 0) return false;
      buf_.append(b, size_t(n));
    }
  }
  json ask(const json &req) {
    std::string l;
    if (!send(req) || !line(&l, 2000)) return json{{"ok", false}, {"error", "no answer"}};
    try {
      return json::parse(l);
    } catch (...) {
      return json{{"ok", false}, {"error", "bad answer"}};
    }
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

std::string str(const json &j, const char *k) {
  return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string();
}

const char *kStates[] = {"-",        "INITIALIZED",     "ONBOARD_STAGED", "ONBOARDING",
                         "PREFILLING", "DECODING",      "SKIPPED_PREFILL", "SKIPPED_DECODE",
                         "PREEMPTED", "FINISHING",      "FINISHED"};

std::string state_name(const json &v) {
  if (v.is_number_unsigned() && v.get<size_t>() < 11) return kStates[v.get<size_t>()];
  return v.is_string() ? v.get<std::string>() : "?";
}

// A tier as events give it ("G2"; before 0.5.0 endpoints sent its number).
std::string tier_name(const json &e, const char *k) {
  if (!e.contains(k)) return "?";
  const json &v = e[k];
  if (v.is_number_unsigned()) return "G" + std::to_string(v.get<uint64_t>());
  return v.is_string() ? v.get<std::string>() : "?";
}

std::string event_line(const json &e) {
  const std::string kind = str(e, "kind");
  char b[256];
  if (kind == "SLOT")
    std::snprintf(b, sizeof b, "#%llu SLOT %s -> %s by %s",
                  (unsigned long long)e.value("seq", 0ull), state_name(e["from"]).c_str(),
                  state_name(e["to"]).c_str(), str(e, "trigger").c_str());
  else if (kind == "CANDIDATE")
    std::snprintf(b, sizeof b, "#%llu CANDIDATE %s batch %llu %s -> %s %llu blocks",
                  (unsigned long long)e.value("seq", 0ull), str(e, "state").c_str(),
                  (unsigned long long)e.value("batch", 0ull), tier_name(e, "src").c_str(),
                  tier_name(e, "dst").c_str(), (unsigned long long)e.value("blocks", 0ull));
  else
    std::snprintf(b, sizeof b, "#%llu %s %s -> %s %s %llu blocks %.3f ms",
                  (unsigned long long)e.value("seq", 0ull), kind.c_str(),
                  tier_name(e, "src").c_str(), tier_name(e, "dst").c_str(),
                  str(e, "status").c_str(), (unsigned long long)e.value("blocks", 0ull),
                  double(e.value("duration_ns", 0ull)) / 1e6);
  return b;
}

// A one-line prompt on the last row; "" when cancelled.
std::string prompt(const char *what) {
  int rows = getmaxy(stdscr);
  move(rows - 1, 0);
  clrtoeol();
  printw("%s", what);
  echo();
  timeout(-1);
  char b[256] = {};
  getnstr(b, sizeof b - 1);
  noecho();
  timeout(200);
  return b;
}

}  // namespace

int main(int argc, char **argv) {
  const bool help = argc == 2 && (std::strcmp(argv[1], "--help") == 0 ||
                                  std::strcmp(argv[1], "-h") == 0);
  if (argc != 2 || argv[1][0] == '-') {
    std::fprintf(help ? stdout : stderr,
                 "usage: kvtier-console PATH   (the socket of kvtier-replay "
                 "--console-socket or kvt_endpoint_open)\n");
    return help ? 0 : 2;
  }
  const std::string path = argv[1];
  Conn c;
  if (!c.open(path)) {
    std::fprintf(stderr, "kvtier-console: cannot connect to '%s': %s\n", path.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::vector<std::string> breakpoints;
  std::string selected, message;
  size_t sel = 0;

  initscr();
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  timeout(200);
  for (bool quit = false; !quit;) {
    json paused = c.ask({{"cmd", "paused"}}), slots = c.ask({{"cmd", "slots"}}),
         batches = c.ask({{"cmd", "batches"}}), tiers = c.ask({{"cmd", "tiers"}});
    if (!paused.value("ok", false) && str(paused, "error") == "no answer") {
      endwin();
      std::fprintf(stderr, "kvtier-console: '%s' went away\n", path.c_str());
      return 0;
    }
    erase();
    int rows = getmaxy(stdscr), row = 0;
    mvprintw(row++, 0, "kvtier-console %s", path.c_str());
    if (paused.value("paused", false))
      mvprintw(row++, 0, "PAUSED at %s: %s -> %s by %s (breakpoint %llu)",
               str(paused, "req_id").c_str(), str(paused, "from").c_str(),
               str(paused, "to").c_str(), str(paused, "trigger").c_str(),
               (unsigned long long)paused.value("breakpoint", 0ull));
    else
      mvprintw(row++, 0, "RUNNING");
    std::string t = "tiers:";
    for (const json &x : tiers.value("tiers", json::array()))
      t += "  " + str(x, "tier") + " " + std::to_string(x.value("registered", 0ull)) + "/" +
           std::to_string(x.value("capacity", 0ull)) + " registered, " +
           std::to_string(x.value("active", 0ull)) + " active";
    mvprintw(row++, 0, "%s", t.c_str());
    std::string b = "breakpoints:";
    for (const std::string &s : breakpoints) b += " " + s;
    mvprintw(row++, 0, "%s%s", b.c_str(), breakpoints.empty() ? " none" : "");
    // The youngest first: new requests are where things happen. The paused one is selected.
    json sl = slots.value("slots", json::array());
    std::stable_sort(sl.begin(), sl.end(), [](const json &a, const json &b) {
      return a.value("age_ms", 0.0) < b.value("age_ms", 0.0);
    });
    if (paused.value("paused", false))
      for (size_t i = 0; i < sl.size(); ++i)
        if (str(sl[i], "req_id") == str(paused, "req_id")) sel = i;
    mvprintw(row++, 0, "SLOTS (%zu)", sl.size());
    mvprintw(row++, 0, "  %-16s %-16s %10s %8s %9s %7s %8s", "REQUEST", "STATE", "AGE ms",
             "TOKENS", "COMPUTED", "BLOCKS", "BATCHES");
    if (sel >= sl.size()) sel = sl.empty() ? 0 : sl.size() - 1;
    const int slot_rows = std::max(3, (rows - 8) / 2 - 2);
    const size_t first = sel >= size_t(slot_rows) ? sel - size_t(slot_rows) + 1 : 0;
    for (size_t i = first; i < sl.size() && row < 6 + slot_rows; ++i) {
      const json &s = sl[i];
      if (i == sel) selected = str(s, "req_id");
      mvprintw(row++, 0, "%c %-16s %-16s %10.1f %8llu %9llu %7llu %8llu", i == sel ? '>' : ' ',
               str(s, "req_id").c_str(), str(s, "state").c_str(), s.value("age_ms", 0.0),
               (unsigned long long)s.value("tokens", 0ull),
               (unsigned long long)s.value("computed", 0ull),
               (unsigned long long)s.value("blocks", 0ull),
               (unsigned long long)s.value("batches", 0ull));
    }
    const json &bt = batches.value("batches", json::array());
    mvprintw(row++, 0, "TRANSFERS IN FLIGHT (%zu)", bt.size());
    for (size_t i = 0; i < bt.size() && row < rows - 8; ++i)
      mvprintw(row++, 0, "  batch %-8llu %-16s %s -> %s %5llu blocks  %s",
               (unsigned long long)bt[i].value("batch", 0ull), str(bt[i], "req_id").c_str(),
               str(bt[i], "src").c_str(), str(bt[i], "dst").c_str(),
               (unsigned long long)bt[i].value("blocks", 0ull),
               bt[i].value("step", 0ull) ? "sent" : "planned");
    mvprintw(row++, 0, "TIMELINE %s", selected.c_str());
    if (!selected.empty()) {
      const int room = std::max(1, rows - 1 - row);
      json tl = c.ask({{"cmd", "timeline"}, {"req_id", selected}, {"n", room}});
      for (const json &e : tl.value("events", json::array()))
        if (row < rows - 1) mvprintw(row++, 2, "%s", event_line(e).c_str());
    }
    mvprintw(rows - 1, 0, "%s",
             message.empty() ? "p pause  r resume  b break at state  i break on request  "
                               "c clear  j/k select  q quit"
                             : message.c_str());
    refresh();

    int ch = getch();
    message.clear();
    json reply;
    switch (ch) {
      case 'q': quit = true; break;
      case 'p': reply = c.ask({{"cmd", "pause"}}); break;
      case 'r': reply = c.ask({{"cmd", "resume"}}); break;
      case 'c':
        reply = c.ask({{"cmd", "clear"}});
        if (reply.value("ok", false)) breakpoints.clear();
        break;
      case 'b': {
        std::string s = prompt("break when a slot enters state: ");
        if (s.empty()) break;
        reply = c.ask({{"cmd", "break"}, {"state", s}});
        if (reply.value("ok", false)) breakpoints.push_back(s);
        break;
      }
      case 'i': {
        std::string s = prompt("break at every call for request: ");
        if (s.empty()) break;
        reply = c.ask({{"cmd", "break"}, {"req_id", s}});
        if (reply.value("ok", false)) breakpoints.push_back("request " + s);
        break;
      }
      case 'j': case KEY_DOWN: ++sel; break;
      case 'k': case KEY_UP: if (sel) --sel; break;
      default: break;
    }
    if (!reply.is_null() && !reply.value("ok", false)) message = "error: " + str(reply, "error");
  }
  endwin();
  return 0;
}
