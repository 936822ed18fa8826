#include "brigade/comm/store_protocol.h"

#include <fmt/format.h>

#include <algorithm>

#include "brigade/core/error.h"

namespace brigade::store_protocol {

Encoder& Encoder::u8(uint8_t v) {
  bytes_.push_back(static_cast<char>(v));
  return *this;
}

Encoder& Encoder::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}

Encoder& Encoder::i64(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}

Encoder& Encoder::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  bytes_.append(s);
  return *this;
}

Encoder& Encoder::strs(const std::vector<std::string>& list) {
  u32(static_cast<uint32_t>(list.size()));
  for (const std::string& s : list) str(s);
  return *this;
}

std::string Encoder::frame() const {
  return Encoder().u32(static_cast<uint32_t>(bytes_.size())).bytes_ + bytes_;
}

uint8_t Decoder::u8() {
  return static_cast<uint8_t>(take(1)[0]);
}

uint32_t Decoder::u32() {
  const std::string_view b = take(4);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(b[i])) << (8 * i);
  return v;
}

int64_t Decoder::i64() {
  const std::string_view b = take(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
  return static_cast<int64_t>(v);
}

std::string Decoder::str() {
  return std::string(take(u32()));
}

std::vector<std::string> Decoder::strs() {
  const uint32_t n = u32();
  // Each string costs at least its 4-byte length, so a count that cannot fit
  // is rejected before reserving memory for it.
  if (n > rest_.size() / 4) throw Error("malformed rendezvous store message (a list too long)");
  // Empty keys cost 4 bytes on the wire but ~32 in memory, and every set
  // scans a parked wait's keys: a list is bounded beyond the frame size.
  if (n > kMaxKeysPerRequest) {
    throw Error(
        fmt::format("malformed rendezvous store message ({} keys in one request; at most {})", n,
                    kMaxKeysPerRequest));
  }
  std::vector<std::string> list;
  list.reserve(n);
  for (uint32_t i = 0; i < n; ++i) list.push_back(str());
  return list;
}

void Decoder::end() const {
  if (!rest_.empty()) throw Error("malformed rendezvous store message (bytes after the end)");
}

std::string_view Decoder::take(size_t n) {
  if (n > rest_.size()) throw Error("malformed rendezvous store message (truncated)");
  const std::string_view b = rest_.substr(0, n);
  rest_.remove_prefix(n);
  return b;
}

uint32_t load_u32(const char* p) {
  return Decoder(std::string_view(p, 4)).u32();
}

namespace {

Request decode_request(std::string_view body) {
  Decoder d(body);
  Request r;
  const uint8_t op = d.u8();
  r.op = static_cast<Op>(op);
  switch (r.op) {
    case Op::kSet:
      r.keys.push_back(d.str());
      r.value = d.str();
      break;
    case Op::kAdd:
      r.keys.push_back(d.str());
      r.delta = d.i64();
      break;
    case Op::kCheck:
      r.keys = d.strs();
      break;
    case Op::kGet:
    case Op::kWait:
      if (r.op == Op::kGet) {
        r.keys.push_back(d.str());
      } else {
        r.keys = d.strs();
      }
      r.timeout_ms = std::clamp<int64_t>(d.i64(), 0, kMaxTimeoutMs);
      break;
    default:
      throw_error("unknown request {}", static_cast<int>(op));
  }
  d.end();
  return r;
}

}  // namespace

Parsed parse_frame(std::string_view in, bool authenticated) {
  Parsed p;
  if (in.size() < 4) {
    p.need = 4;
    return p;
  }
  const uint32_t bytes = load_u32(in.data());
  const uint32_t limit = authenticated ? kMaxFrameBytes : kMaxHandshakeBytes;
  if (bytes > limit) {
    p.kind = Parsed::Kind::kOversized;
    p.declared = bytes;
    p.limit = limit;
    return p;
  }
  const size_t whole = 4 + size_t{bytes};
  if (in.size() < whole) {
    p.need = whole;
    return p;
  }
  const std::string_view body = in.substr(4, bytes);
  p.consumed = whole;
  try {
    if (authenticated) {
      p.request = decode_request(body);
      p.kind = Parsed::Kind::kRequest;
    } else {
      Decoder d(body);
      p.handshake.magic = d.str();
      p.handshake.token = d.str();
      d.end();
      p.kind = Parsed::Kind::kHandshake;
    }
  } catch (const Error& e) {
    p.kind = Parsed::Kind::kMalformed;
    p.error = e.what();
  }
  return p;
}

}  // namespace brigade::store_protocol
