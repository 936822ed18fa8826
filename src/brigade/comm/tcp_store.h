// The rendezvous key-value store: how the processes of one job find each other.
//
// One process (the launcher on node 0) runs a TcpStoreServer; launchers and
// workers open TcpStore clients to it. A worker publishes what its peers need
// (an address, a shared-memory name) under a key and blocks in get() until
// the peers have published theirs; add() counts arrivals and hands out
// unique numbers.
//
// Anyone who can reach the port can reach the store, so every connection must
// first present the job's secret token (BRIGADE_STORE_TOKEN, which `brigade
// launch` generates and gives its workers). The server closes any connection
// that does not, and logs one line naming the peer.
//
// Wire protocol: every message is a frame, a u32 byte count then that many
// bytes; integers are little-endian, strings are a u32 length then the bytes.
//   handshake  client -> "brigade-store/1" token
//              server -> u8 status (kOk, or kRefused and the server closes)
//   request    u8 op, then per op:
//                kSet   key value            -> kOk
//                kGet   key i64 timeout_ms   -> kOk value | kTimeout
//                kAdd   key i64 delta        -> kOk i64 new_value | kError message
//                kCheck u32 n, n keys        -> kOk u8 all_present
//                kWait  u32 n, n keys, i64 timeout_ms -> kOk | kTimeout
//   kTimeout carries the missing keys (u32 n, n keys); kError a message.
// A blocking get/wait is parked on the server, which answers when the keys
// appear or its deadline passes; the connection reads no further requests
// meanwhile, so replies always come back in request order. A frame may hold
// at most 64 MiB (store_protocol::kMaxFrameBytes); the server drops a client
// that announces more, logging the peer and the sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "brigade/core/error.h"

namespace brigade {

// Thrown when get() or wait() runs out of time; the message names the keys,
// the store and the timeout. A subclass so that a caller waiting for peers
// can tell "they did not come" from "the store is gone".
class StoreTimeoutError : public Error {
 public:
  using Error::Error;
};

// Serves the store on a background thread until stop() or destruction.
// Handles any number of clients with one poll loop; values live in memory.
class TcpStoreServer {
 public:
  // Binds host:port and starts serving. host "" listens on every interface;
  // port 0 lets the kernel pick a free port (see port()). Throws Error if the
  // address cannot be bound.
  TcpStoreServer(std::string host, uint16_t port, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port actually bound.
  uint16_t port() const;

  // What the server buffers per connection, beyond one frame: it stops
  // reading a connection whose unprocessed requests reach this much, whose
  // unsent replies do (the client is not reading them), or whose get/wait is
  // parked, and reads on once that clears. A client that pipelines requests
  // faster is slowed down by TCP, never dropped.
  static constexpr size_t kBufferBytes = 64 * 1024;

  struct Stats {
    // The most one connection has held at once, unprocessed requests plus
    // unsent replies: under 2 * kBufferBytes, plus one frame when frames are
    // larger than kBufferBytes.
    size_t buffered_high_water_bytes = 0;
    // Gets and waits that had to be parked until their keys came.
    uint64_t parked_requests = 0;
  };
  // Safe to call from any thread; for tests and diagnostics.
  Stats stats() const;

  // Closes every connection and joins the serving thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client connection. Safe to share between threads (calls are serialized).
// Every call either succeeds or throws Error naming the store's address.
class TcpStore {
 public:
  // Connects, retrying until timeout_ms passes (the server may start later),
  // and presents `token`. Throws Error if the server cannot be reached in
  // time or refuses the token. timeout_ms also bounds every later call.
  TcpStore(std::string host, uint16_t port, std::string token, int64_t timeout_ms);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, std::string_view value);

  // Blocks until `key` exists, then returns its value. Throws
  // StoreTimeoutError after timeout_ms.
  std::string get(const std::string& key);

  // Adds `delta` to the counter under `key` (absent counts as 0) and returns
  // the new value, atomically across all clients. add(key, 0) reads it. The
  // value is stored as decimal text, so get() of a counter returns "3".
  int64_t add(const std::string& key, int64_t delta);

  // Blocks until every key exists; throws StoreTimeoutError naming the missing
  // ones after timeout_ms (or the given timeout).
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, int64_t timeout_ms);

  // Whether every key exists now; never blocks on the keys.
  bool check(const std::vector<std::string>& keys);

  // "host:port", for messages.
  const std::string& address() const { return address_; }
  // This end of the connection, as a numeric address ("10.0.0.7", "::1"):
  // the address of the interface that routes to the store's host, which is
  // what peers that reach that host can reach this process on.
  std::string local_address();
  int64_t timeout_ms() const { return timeout_ms_; }

 private:
  void connect_and_authenticate();
  // Sends one request frame and returns the reply frame, waiting for it at
  // most reply_timeout_ms. Reconnects first if an earlier call lost the
  // connection. `what` names the call in errors.
  std::string round_trip(const std::string& request, int64_t reply_timeout_ms,
                         const std::string& what);
  void disconnect();

  std::string host_;
  uint16_t port_;
  std::string token_;
  int64_t timeout_ms_;
  std::string address_;
  std::string local_address_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace brigade
