// The rendezvous store's wire format (described in tcp_store.h), shared by
// the server, the client and the fuzz target (fuzz/store_frame_fuzz.cc).
//
// parse_frame() is the whole of what the server believes about bytes from the
// network: it is pure (bytes in, a verdict out), so it can be fuzzed on its
// own, and the server acts only on what it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::store_protocol {

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2, kRefused = 3 };

inline constexpr std::string_view kMagic = "brigade-store/1";
// Before a peer has shown the token it may not make the server buffer more
// than this.
inline constexpr uint32_t kMaxHandshakeBytes = 4096;
// The largest request or reply. The store carries addresses and small
// records; a frame this large is a bug or an attack, and the server holds a
// whole frame in memory before acting on it.
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
// The most keys one check or wait may name.
inline constexpr uint32_t kMaxKeysPerRequest = 65536;
// A blocking request's timeout is clamped to this (about 35 years).
inline constexpr int64_t kMaxTimeoutMs = int64_t{1} << 40;

class Encoder {
 public:
  Encoder& u8(uint8_t v);
  Encoder& op(Op v) { return u8(static_cast<uint8_t>(v)); }
  Encoder& status(Status v) { return u8(static_cast<uint8_t>(v)); }
  Encoder& u32(uint32_t v);
  Encoder& i64(int64_t v);
  Encoder& str(std::string_view s);
  Encoder& strs(const std::vector<std::string>& list);
  // The bytes with their u32 length in front: one frame on the wire.
  std::string frame() const;
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Reads what Encoder wrote; throws brigade::Error on a truncated message or
// a count that cannot fit in what is left.
class Decoder {
 public:
  explicit Decoder(std::string_view bytes) : rest_(bytes) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  std::vector<std::string> strs();
  // Throws unless everything was read.
  void end() const;

 private:
  std::string_view take(size_t n);

  std::string_view rest_;
};

// The u32 frame length at p (4 bytes, little-endian).
uint32_t load_u32(const char* p);

struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;  // one for kSet, kGet and kAdd
  std::string value;              // kSet
  int64_t delta = 0;              // kAdd
  int64_t timeout_ms = 0;         // kGet, kWait; in [0, kMaxTimeoutMs]
};

struct Handshake {
  std::string magic;  // kMagic from a brigade client
  std::string token;
};

// The verdict on the bytes at the front of a connection's input.
struct Parsed {
  enum class Kind {
    kNeedMore,   // no whole frame yet; `need` says how many bytes would make one
    kHandshake,  // `handshake`, from `consumed` bytes
    kRequest,    // `request`, from `consumed` bytes
    kOversized,  // the frame declares `declared` bytes, over `limit`
    kMalformed,  // a whole frame that does not decode: `error` says why
  };
  Kind kind = Kind::kNeedMore;
  size_t consumed = 0;
  size_t need = 4;
  uint32_t declared = 0;
  uint32_t limit = 0;
  std::string error;
  Handshake handshake;
  Request request;
};

// Parses the first frame of `in`: a handshake until the peer is
// authenticated, a request after. Never throws; never reads past `in`.
Parsed parse_frame(std::string_view in, bool authenticated);

}  // namespace brigade::store_protocol
