// libFuzzer target: any bytes as what a peer sends the rendezvous store.
// The server's parser (store_protocol::parse_frame) must never read past the
// input, never throw, and only ever: ask for more bytes than it has, refuse a
// frame over the limit, reject a whole frame as malformed, or return a
// handshake or request that encodes back to exactly the bytes it consumed.
// The input is parsed as the server would, frame after frame, first as a
// stranger (the first frame a handshake) and then as a token holder.
#include <cstdint>
#include <string>
#include <string_view>

#include "brigade/comm/store_protocol.h"

namespace {

namespace sp = brigade::store_protocol;

std::string encode(const sp::Request& r) {
  sp::Encoder e;
  e.op(r.op);
  switch (r.op) {
    case sp::Op::kSet:
      e.str(r.keys.at(0)).str(r.value);
      break;
    case sp::Op::kAdd:
      e.str(r.keys.at(0)).i64(r.delta);
      break;
    case sp::Op::kCheck:
      e.strs(r.keys);
      break;
    case sp::Op::kGet:
      if (r.keys.size() != 1) __builtin_trap();
      e.str(r.keys[0]).i64(r.timeout_ms);
      break;
    case sp::Op::kWait:
      e.strs(r.keys).i64(r.timeout_ms);
      break;
    default:
      __builtin_trap();  // parse_frame returned an op it does not know
  }
  return e.frame();
}

// Parses frames off the front of `in` until one is not a whole, good frame.
void parse_all(std::string_view in, bool authenticated) {
  for (;;) {
    const sp::Parsed p = sp::parse_frame(in, authenticated);
    switch (p.kind) {
      case sp::Parsed::Kind::kNeedMore:
        if (p.need <= in.size() || p.need > 4 + size_t{sp::kMaxFrameBytes}) __builtin_trap();
        return;
      case sp::Parsed::Kind::kOversized:
        if (p.declared <= p.limit || in.size() < 4) __builtin_trap();
        return;
      case sp::Parsed::Kind::kMalformed:
        if (p.error.empty() || p.consumed > in.size()) __builtin_trap();
        return;
      case sp::Parsed::Kind::kHandshake: {
        if (authenticated || p.consumed > in.size()) __builtin_trap();
        const std::string again =
            sp::Encoder().str(p.handshake.magic).str(p.handshake.token).frame();
        if (again != in.substr(0, p.consumed)) __builtin_trap();
        break;
      }
      case sp::Parsed::Kind::kRequest: {
        if (!authenticated || p.consumed > in.size()) __builtin_trap();
        const sp::Request& r = p.request;
        if (r.timeout_ms < 0 || r.timeout_ms > sp::kMaxTimeoutMs) __builtin_trap();
        // A clamped timeout does not encode back to what was sent.
        const bool clamped = r.timeout_ms == 0 || r.timeout_ms == sp::kMaxTimeoutMs;
        if (!clamped && encode(r) != in.substr(0, p.consumed)) __builtin_trap();
        break;
      }
    }
    in.remove_prefix(p.consumed);
    authenticated = true;  // what follows a handshake is requests
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  parse_all(in, /*authenticated=*/false);
  parse_all(in, /*authenticated=*/true);
  return 0;
}
