#include "brigade/elastic/snapshot_sync.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "brigade/ckpt/node_part.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/coordinator_keys.h"

namespace brigade::elastic {

std::string snapshot_key(int64_t generation, int node) {
  return coordinator_key(fmt::format("gen/{}/snapshot/{}", generation, node));
}

std::string replica_address_key(int64_t generation, int node) {
  return coordinator_key(fmt::format("gen/{}/replica/{}", generation, node));
}

int replica_peer(const std::vector<int>& members, int node) {
  const auto it = std::find(members.begin(), members.end(), node);
  if (it == members.end() || members.size() < 2) return -1;
  const auto next = std::next(it);
  return next == members.end() ? members.front() : *next;
}

int replica_source(const std::vector<int>& members, int node) {
  const auto it = std::find(members.begin(), members.end(), node);
  if (it == members.end() || members.size() < 2) return -1;
  return it == members.begin() ? members.back() : *std::prev(it);
}

void publish_replica_address(CoordinatorStore& store, int64_t generation, int node,
                             const ReplicaAddress& address) {
  store.set(replica_address_key(generation, node),
            fmt::format("{}:{}", address.host, address.port));
}

std::optional<ReplicaAddress> read_replica_address(CoordinatorStore& store, int64_t generation,
                                                   int node) {
  const std::string key = replica_address_key(generation, node);
  const std::optional<std::string> value = store.try_get(key);
  if (!value) return std::nullopt;
  const size_t colon = value->rfind(':');
  unsigned port = 0;
  const char* end = value->data() + value->size();
  if (colon == std::string::npos || colon == 0 ||
      std::from_chars(value->data() + colon + 1, end, port).ptr != end ||
      colon + 1 == value->size() || port == 0 || port > 65535) {
    throw MalformedValue(key, *value, "host:port with a port in 1..65535");
  }
  return ReplicaAddress{value->substr(0, colon), static_cast<uint16_t>(port)};
}

void publish_snapshot_step(CoordinatorStore& store, int64_t generation, int node, int64_t step) {
  const std::optional<int64_t> recorded = read_snapshot_step(store, generation, node);
  if (recorded && *recorded >= step) return;
  store.set(snapshot_key(generation, node), std::to_string(step));
}

std::optional<int64_t> read_snapshot_step(CoordinatorStore& store, int64_t generation, int node) {
  const std::string key = snapshot_key(generation, node);
  const std::optional<std::string> value = store.try_get(key);
  if (!value) return std::nullopt;
  return detail::parse_count(key, *value);
}

std::optional<int64_t> newest_complete_step(CoordinatorStore& store, int64_t generation,
                                            const std::vector<int>& members) {
  std::optional<int64_t> least;
  for (const int node : members) {
    const std::optional<int64_t> step = read_snapshot_step(store, generation, node);
    if (!step) return std::nullopt;
    least = least ? std::min(*least, *step) : *step;
  }
  return least;
}

std::string written_key(int64_t generation, int node) {
  return coordinator_key(fmt::format("gen/{}/written/{}", generation, node));
}

std::string restore_key(int64_t generation, int node) {
  return coordinator_key(fmt::format("gen/{}/restore/{}", generation, node));
}

std::string restore_decision_key(int64_t generation) {
  return coordinator_key(fmt::format("gen/{}/restore/decision", generation));
}

std::string restore_deciding_key(int64_t generation) {
  return coordinator_key(fmt::format("gen/{}/restore/deciding", generation));
}

std::vector<int> members_of(CoordinatorStore& store, int64_t generation, int nnodes) {
  for (int64_t g = generation; g >= 1; --g) {
    const std::string key = detail::members_key(g);
    if (const std::optional<std::string> text = store.try_get(key)) {
      return detail::parse_members(key, *text, nnodes, store.elects_leader());
    }
  }
  std::vector<int> all;
  for (int n = 0; n < nnodes; ++n) all.push_back(n);
  return all;
}

std::string local_address_towards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* head = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &head); rc != 0) {
    throw_error("cannot resolve {}: {}", host, ::gai_strerror(rc));
  }
  std::string address;
  std::string why = "no address";
  for (addrinfo* a = head; a != nullptr && address.empty(); a = a->ai_next) {
    // A datagram socket's connect sends nothing: it only picks the route,
    // and with it the local address the other nodes reach this host at.
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {};
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), length, text, sizeof(text), nullptr, 0,
                      NI_NUMERICHOST) == 0) {
      address = text;
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(head);
  if (address.empty()) throw_error("no route from this host to {}:{}: {}", host, port, why);
  return address;
}

namespace {

int64_t half_the_free_space(const std::filesystem::path& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize) / 2;
}

// Assembled snapshots (step directories) in the area but `keep`, and
// every part: the restarted workers start a new branch of history, and a
// part of the old one (a step after the one resumed from) must never be
// offered, recorded or assembled in the new generation.
void clear_area(const std::filesystem::path& area, int64_t keep) {
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  for (const auto& entry : std::filesystem::directory_iterator(area, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("step_")) continue;
    if (name.ends_with(".part") ||
        (name.find('.') == std::string::npos && entry.path() != step_directory(area, keep))) {
      doomed.push_back(entry.path());
    }
  }
  for (const auto& dir : doomed) std::filesystem::remove_all(dir, ec);
}

}  // namespace

SnapshotSync::SnapshotSync(Options options) : options_(std::move(options)) {
  if (options_.store == nullptr) throw_error("SnapshotSync needs the coordinator's store");
  if (options_.max_bytes <= 0) options_.max_bytes = half_the_free_space(options_.area);
  ReplicaServerOptions o;
  o.host = options_.host;
  o.token = options_.token;
  o.root = options_.area / "replicas";
  o.max_bytes = options_.max_bytes;
  o.nodes = options_.nnodes;
  o.io_timeout_ms = options_.io_timeout_ms;
  o.log = options_.log;
  server_ = std::make_unique<ReplicaServer>(std::move(o));
}

SnapshotSync::~SnapshotSync() = default;

void SnapshotSync::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "brigade launch: %s\n", line.c_str());
    std::fflush(stderr);
  }
}

void SnapshotSync::enter_generation(int64_t generation, int node, const std::vector<int>& members) {
  sender_.reset();
  generation_ = generation;
  node_ = node;
  peer_ = replica_peer(members, node);
  offered_ = -1;
  recorded_ = -1;
  waiting_since_ns_ = 0;
  frozen_ = false;
  replication_off_ = false;
  server_->serve_own(node, options_.area);
  try {
    publish_replica_address(*options_.store, generation, node, {options_.host, server_->port()});
  } catch (const Error& e) {
    // A lost store is lost contact, which the agent's next poll reports;
    // meanwhile nobody can replicate to this node (its peer finds no address).
    log(fmt::format("node {} could not publish its snapshot replica address: {}", node, e.what()));
  }
}

void SnapshotSync::tick() {
  if (frozen_ || replication_off_) return;
  try {
    const std::vector<int64_t> steps = node_part_steps(options_.area);
    if (peer_ < 0) {
      // Alone in the generation: written is all there is.
      if (!steps.empty() && steps.back() > recorded_) {
        publish_snapshot_step(*options_.store, generation_, node_, steps.back());
        recorded_ = steps.back();
      }
      return;
    }
    if (!sender_) {
      const std::optional<ReplicaAddress> peer =
          read_replica_address(*options_.store, generation_, peer_);
      if (!peer) return;  // its agent has not started the generation yet
      sender_ = std::make_unique<ReplicaSender>(
          ReplicaSender::Peer{peer->host, peer->port, options_.token, options_.io_timeout_ms},
          node_, generation_, options_.log);
    }
    if (!steps.empty() && steps.back() > offered_) {
      offered_ = steps.back();
      sender_->offer(offered_, node_part_directory(options_.area, offered_));
    }
    const int64_t sent = sender_->sent_step();
    if (sent > recorded_) {
      publish_snapshot_step(*options_.store, generation_, node_, sent);
      recorded_ = sent;
    }
  } catch (const MalformedValue& e) {
    // Not ours to fix, and the same every tick: said once.
    replication_off_ = true;
    log(fmt::format("snapshot replication of node {} is off for generation {}: {}", node_,
                    generation_, e.what()));
  } catch (const Error& e) {
    log(fmt::format("snapshot replication of node {}: {}", node_, e.what()));
  }
}

bool SnapshotSync::caught_up(int64_t step, int64_t now_ns) {
  // The workers wait after `step` before its snapshot starts: step - 1's
  // part is the newest there can be (snapshot_every 1).
  if (offered_ < 0 || (recorded_ >= step - 1 && recorded_ >= offered_)) {
    waiting_since_ns_ = 0;
    return true;
  }
  if (waiting_since_ns_ == 0) waiting_since_ns_ = now_ns;
  const int64_t waited_ms = (now_ns - waiting_since_ns_) / kNsPerMs;
  if (waited_ms < 1'000 || (recorded_ < offered_ && waited_ms < 10'000)) return false;
  waiting_since_ns_ = 0;
  return true;
}

void SnapshotSync::freeze() {
  if (frozen_) return;
  frozen_ = true;
  sender_.reset();
  // What the node's owner can serve at the restart, replicated or not (a
  // failure can come before the first record: steps faster than a tick).
  try {
    const std::vector<int64_t> steps = node_part_steps(options_.area);
    if (!steps.empty()) {
      options_.store->set(written_key(generation_, node_), std::to_string(steps.back()));
    }
  } catch (const Error& e) {
    log(fmt::format("snapshot parts of node {}: {}", node_, e.what()));
  }
}

std::string SnapshotSync::assemble(int64_t failed, int64_t step, const std::vector<int>& members,
                                   int node) {
  namespace fs = std::filesystem;
  const fs::path staging = options_.area / "restore";
  std::error_code ec;
  fs::remove_all(staging, ec);
  std::vector<fs::path> parts;
  std::string why;
  std::set<int>& unreachable = unreachable_;
  for (const int m : members) {
    const fs::path own = node_part_directory(options_.area, step);
    if (m == node && fs::exists(own / kNodePartFile)) {
      parts.push_back(own);
      continue;
    }
    // The owner's part, else the replica its peer keeps (the owner is lost).
    std::vector<int> sources = {m};
    if (const int peer = replica_peer(members, m); peer >= 0) sources.push_back(peer);
    bool fetched = false;
    std::string tried;
    for (const int source : sources) {
      if (given_up_) {
        tried += fmt::format("{}the job ended during the restore", tried.empty() ? "" : "; ");
        break;
      }
      if (unreachable.contains(source)) continue;
      try {
        const std::optional<ReplicaAddress> at =
            read_replica_address(*options_.store, failed, source);
        if (!at) throw_error("node {} published no replica address", source);
        const fs::path root = staging / fmt::format("node-{}", m);
        fetch_replica(at->host, at->port, options_.token, m, root, options_.max_bytes,
                      options_.io_timeout_ms, step, options_.connect_timeout_ms, failed);
        const fs::path part = node_part_directory(root, step);
        fs::rename(step_directory(root, step), part);
        parts.push_back(part);
        fetched = true;
        break;
      } catch (const Error& e) {
        tried += fmt::format("{}node {}: {}", tried.empty() ? "" : "; ", source, e.what());
        const std::string what = e.what();
        // The owner answered that it holds no such part: final. It may have
        // discarded the part (a silent corruption found after it was
        // replicated), and its peer's replica would bring it back.
        if (source == m &&
            what.find(" refused: it holds no part of its own node ") != std::string::npos) {
          break;
        }
        // A server that answered holds no such part; one that did not is
        // not asked again in this restart (a cut-off node costs one timeout).
        if (what.find(" refused: it ") == std::string::npos) unreachable.insert(source);
      }
    }
    if (!fetched) {
      why = fmt::format("node {}'s part of step {} could not be fetched ({})", m, step, tried);
      break;
    }
  }
  if (why.empty()) {
    try {
      const fs::path dir = assemble_checkpoint(parts, options_.area);
      verify_checkpoint(dir, /*snapshot=*/true);
    } catch (const std::exception& e) {  // a filesystem_error too (ENOSPC)
      why = e.what();
    }
  }
  fs::remove_all(staging, ec);
  return why;
}

std::optional<int64_t> SnapshotSync::restore(int64_t generation, int node,
                                             const std::vector<int>& members,
                                             const std::function<bool()>& keep_alive,
                                             int64_t disk_step) {
  given_up_ = false;
  if (!keep_alive) return restore_here(generation, node, members, disk_step);
  std::optional<int64_t> result;
  std::exception_ptr failure;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread worker([&] {
    try {
      result = restore_here(generation, node, members, disk_step);
    } catch (...) {
      failure = std::current_exception();
    }
    const std::lock_guard lock(mutex);
    done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mutex);
  while (!done) {
    lock.unlock();
    if (!given_up_ && !keep_alive()) given_up_ = true;
    lock.lock();
    cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; });
  }
  lock.unlock();
  worker.join();
  if (failure) std::rethrow_exception(failure);
  return result;
}

std::optional<int64_t> SnapshotSync::resumed_copy(int64_t failed, int node, int64_t disk_step,
                                                  std::string& why) {
  if (failed < 1) return std::nullopt;  // generation 0 resumed from no snapshot
  const std::string key = restore_decision_key(failed);
  const std::optional<std::string> decision = options_.store->try_get(key);
  if (!decision || *decision == "none") return std::nullopt;
  const int64_t step = detail::parse_count(key, *decision);
  if (step <= disk_step) return std::nullopt;  // the disk checkpoint is as new
  const std::filesystem::path dir = step_directory(options_.area, step);
  try {
    verify_checkpoint(dir, /*snapshot=*/true);
  } catch (const std::exception& e) {
    why += fmt::format("; node {} holds no copy of step {}, which generation {} resumed from ({})",
                       node, step, failed, e.what());
    return std::nullopt;
  }
  log(
      fmt::format("node {}: generation {} left no snapshot to resume from ({}); the copy of step "
                  "{} it resumed from instead",
                  node, failed, why, step));
  return step;
}

std::optional<int64_t> SnapshotSync::restore_here(int64_t generation, int node,
                                                  const std::vector<int>& members,
                                                  int64_t disk_step) {
  const int64_t failed = generation - 1;
  std::optional<int64_t> chosen;
  std::string why;
  try {
    const std::vector<int> failed_members = members_of(*options_.store, failed, options_.nnodes);
    // -1: no step (every member's part is needed); most < least: none.
    int64_t least = -1, most = -2;
    for (const int m : failed_members) {
      std::optional<int64_t> step = read_snapshot_step(*options_.store, failed, m);
      const std::string key = written_key(failed, m);
      if (const auto written = options_.store->try_get(key)) {
        // The owner's own word once its workers were gone: newer than its
        // record (not replicated yet), or older after a discard (a silent
        // corruption found after the part was replicated).
        step = detail::parse_count(key, *written);
      }
      if (!step) {
        why = fmt::format("node {} recorded no snapshot part in generation {}", m, failed);
        most = -2;
        break;
      }
      least = least < 0 ? *step : std::min(least, *step);
      most = std::max(most, *step);
    }
    // Newest first, from the newest part any member wrote (a live owner
    // serves it, replicated or not) down to the least: the same steps on
    // every node, tried against the same sources, so every node reaches the
    // same one.
    unreachable_.clear();
    // A member the coordinator declared lost in the failed generation is
    // not asked for its part: its peer's replica is it. Dead, its server
    // refuses at once anyway; cut off the network, it never accepts, and
    // asking cost every node the connect timeout (2 s) before the replica.
    for (const int m : failed_members) {
      const std::string key = detail::lost_key(m);
      const auto lost_in = options_.store->try_get(key);
      if (lost_in && detail::parse_count(key, *lost_in) >= failed) unreachable_.insert(m);
    }
    if (most >= 0 && disk_step >= most) {
      why =
          fmt::format("the newest disk checkpoint is at least as new as any part (step {})", most);
      most = -2;
    }
    for (int64_t step = most; step >= 0 && step >= least && !given_up_; --step) {
      const std::string failure = assemble(failed, step, failed_members, node);
      if (failure.empty()) {
        chosen = step;
        break;
      }
      why = failure;
    }
    if (!chosen && !given_up_) chosen = resumed_copy(failed, node, disk_step, why);
  } catch (const std::exception& e) {
    why = e.what();
  }
  // Every member resumes from the same state, or none from a snapshot:
  // each says what it assembled, and the first to have heard from every
  // member (or given up waiting) decides for all, once: a node that timed
  // out and resumes from disk never leaves a slower one to decide alone on
  // the snapshot.
  std::string proposal = "none";
  try {
    options_.store->set(restore_key(generation, node),
                        chosen ? std::to_string(*chosen) : std::string("none"));
    const int64_t deadline = now_ns() + options_.agree_timeout_ms * kNsPerMs;
    std::map<int, std::string> said;
    while (said.size() < members.size()) {
      for (const int m : members) {
        if (said.contains(m)) continue;
        if (auto value = options_.store->try_get(restore_key(generation, m))) said[m] = *value;
      }
      if (said.size() == members.size()) break;
      if (given_up_) throw_error("the job ended during the restore");
      if (now_ns() > deadline) {
        throw_error("not every node said which snapshot it assembled within {} ms",
                    options_.agree_timeout_ms);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    bool same = chosen.has_value();
    for (const auto& [m, value] : said) {
      if (value != "none" &&
          (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)) {
        throw MalformedValue(restore_key(generation, m), value, "a step or \"none\"");
      }
      if (!chosen || value == std::to_string(*chosen)) continue;
      same = false;
      why = value == "none"
                ? fmt::format("node {} could not assemble it", m)
                : fmt::format("node {} assembled step {}, this node {}", m, value, *chosen);
    }
    if (same) proposal = std::to_string(*chosen);
  } catch (const std::exception& e) {
    why = e.what();
  }
  std::optional<int64_t> agreed;
  try {
    const std::string decision_key = restore_decision_key(generation);
    if (options_.store->add(restore_deciding_key(generation), 1) == 1) {
      options_.store->set(decision_key, proposal);
    }
    // The decider writes it right after its add: a long wait means it died.
    const int64_t deadline = now_ns() + options_.agree_timeout_ms * kNsPerMs;
    std::optional<std::string> decision;
    while (!(decision = options_.store->try_get(decision_key))) {
      if (given_up_) throw_error("the job ended during the restore");
      if (now_ns() > deadline) {
        throw_error("no node decided on the snapshot within {} ms", options_.agree_timeout_ms);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (*decision != "none" &&
        (decision->empty() || decision->find_first_not_of("0123456789") != std::string::npos)) {
      throw MalformedValue(decision_key, *decision, "a step or \"none\"");
    }
    if (chosen && *decision == std::to_string(*chosen)) {
      agreed = chosen;
    } else if (proposal != "none") {
      why = fmt::format("another node decided on {} (it heard from the nodes first)",
                        *decision == "none" ? "no snapshot" : "step " + *decision);
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  // Every member has assembled (or given up): nobody fetches a part any
  // more.
  if (agreed) {
    clear_area(options_.area, *agreed);
    log(fmt::format("node {} resumes from the in-memory snapshot of step {}, as every node does",
                    node, *agreed));
  } else {
    clear_area(options_.area, -1);
    log(
        fmt::format("node {}: no in-memory snapshot to resume from ({}); the newest disk "
                    "checkpoint instead",
                    node, why));
  }
  return agreed;
}

}  // namespace brigade::elastic
