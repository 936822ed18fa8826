#include "brigade/comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "brigade/comm/advertised_address.h"
#include "brigade/comm/flight_recorder.h"
#include "brigade/comm/op_description.h"
#include "brigade/comm/op_queue.h"
#include "brigade/comm/tcp_store.h"
#include "brigade/core/clock.h"

namespace brigade {
namespace {

// Gloo's own collectives use slot prefixes 0x01..0x08 (gloo/types.h); ours
// must not collide with them.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kPointToPointSlotPrefix = 0x41;

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Gloo's rendezvous speaks to a gloo::rendezvous::Store; this one forwards to
// our TcpStore with every key under the group's prefix.
class PrefixedTcpStore final : public gloo::rendezvous::Store {
 public:
  PrefixedTcpStore(TcpStore& store, std::string prefix)
      : store_(store), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_.get(prefix_ + key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(prefixed(keys)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(prefixed(keys), timeout.count());
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const std::string& key : keys) out.push_back(prefix_ + key);
    return out;
  }

  TcpStore& store_;
  std::string prefix_;
};

// Calls f(std::type_identity<T>{}) with the C++ type of `dtype`.
template <typename F>
void visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(std::type_identity<float>{});
    case DType::kF64:
      return f(std::type_identity<double>{});
    case DType::kI32:
      return f(std::type_identity<int32_t>{});
    case DType::kI64:
      return f(std::type_identity<int64_t>{});
  }
}

template <typename T>
void divide_by(T* data, int64_t count, int size) {
  const T divisor = static_cast<T>(size);
  for (int64_t i = 0; i < count; ++i) data[i] /= divisor;
}

}  // namespace

struct GlooCommunicator::Impl {
  explicit Impl(GlooCommunicatorOptions opts);
  ~Impl();

  // Rendezvous: join, wait for every rank, connect the full mesh.
  void connect();
  // Queues `body` as one operation; it runs with `running` and the deadline
  // set, and gets the operation's sequence number as its Gloo tag.
  std::shared_ptr<Work> enqueue(std::string what, int64_t bytes,
                                std::function<void(uint32_t tag)> body);
  // OpQueue's failure hook: classifies what Gloo threw, then describe_failure.
  CommError on_failure(std::exception_ptr error);
  // Turns the running operation's failure into the CommError callers see,
  // after telling the peers (see the header on blame).
  CommError describe_failure(const std::string& kind, const std::string& reason);
  std::chrono::milliseconds wait_timeout() const;

  void all_reduce(std::byte* data, int64_t count, DType dtype, ReduceOp op, uint32_t tag);
  void reduce_scatter(const std::byte* input, std::byte* output, int64_t count, DType dtype,
                      ReduceOp op, uint32_t tag);
  void all_gather(const std::byte* input, std::byte* output, int64_t count, DType dtype,
                  uint32_t tag);
  void broadcast(std::byte* data, int64_t count, DType dtype, int root, uint32_t tag);
  void barrier(uint32_t tag);
  // send/recv: posted to Gloo at once (a send from a private copy, so it is
  // eager), then waited for on a thread of their own, since waiting on them
  // in any fixed order could deadlock a pipeline schedule.
  std::shared_ptr<Work> point_to_point(bool is_send, const std::byte* data, int64_t bytes, int peer,
                                       uint32_t tag, std::string what);
  void reap_finished_waiters(bool all);

  GlooCommunicatorOptions options;
  int rank;
  int size;
  std::string key_prefix;  // "gloo/<group>/", or "gloo/g<generation>/<group>/"
  std::unique_ptr<TcpStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;

  std::unique_ptr<OpQueue> ops;

  struct Waiter {
    std::thread thread;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    std::shared_ptr<Work> work;
  };
  std::mutex waiters_mutex;
  std::list<Waiter> waiters;
  uint64_t next_p2p_seq = 0;

  // Touched only by the communication thread once it runs.
  const OpQueue::Op* running = nullptr;
  int64_t deadline_ns = 0;
};

GlooCommunicator::Impl::Impl(GlooCommunicatorOptions opts)
    : options(std::move(opts)),
      rank(options.rank),
      size(options.size),
      key_prefix(options.generation == 0
                     ? "gloo/" + options.group_name + "/"
                     : fmt::format("gloo/g{}/{}/", options.generation, options.group_name)) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw_error("gloo group '{}': rank {} is not in a group of size {}", options.group_name, rank,
                size);
  }
  if (options.timeout_ms <= 0) {
    throw_error("gloo group '{}': timeout_ms must be positive, got {}", options.group_name,
                options.timeout_ms);
  }
  if (options.group_name.empty()) throw_error("gloo communicator: group_name must not be empty");
  options.world_ranks =
      group_members("gloo", options.group_name, size, std::move(options.world_ranks));
}

GlooCommunicator::Impl::~Impl() {
  ops.reset();  // finishes queued operations while the context is still up
  reap_finished_waiters(true);
}

void GlooCommunicator::Impl::connect() {
  // A peer that vanished mid-write must cost an error, not the process.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }

  store = std::make_unique<TcpStore>(options.store_host, options.store_port, options.store_token,
                                     options.timeout_ms);
  // Our own arrival round first: Gloo's would only say a key is missing.
  store->set(key_prefix + "joined/" + std::to_string(rank), "1");
  std::vector<std::string> joined_keys;
  for (int r = 0; r < size; ++r) joined_keys.push_back(key_prefix + "joined/" + std::to_string(r));
  try {
    store->wait(joined_keys);
  } catch (const StoreTimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store->check({joined_keys[r]})) missing.push_back(r);
    }
    throw CommError(fmt::format("gloo group '{}' (rank {} of {}): rank(s) {} did not join "
                                "through store {} within {} ms",
                                options.group_name, rank, size, rank_list(missing),
                                store->address(), options.timeout_ms),
                    missing);
  }

  // Where to listen, and how that was chosen: a connect error must say what
  // this rank advertised, since a peer that cannot reach it only times out.
  gloo::transport::tcp::attr attr;
  std::string advertised, chosen_by;
  if (!options.bind_interface.empty()) {
    attr.iface = options.bind_interface;
    advertised = "interface " + options.bind_interface;
    chosen_by = "named by " + options.bind_interface_source;
  } else if (!options.bind_hostname.empty()) {
    attr.hostname = options.bind_hostname;
    advertised = options.bind_hostname;
    chosen_by = "given as bind_hostname";
  } else {
    AdvertisedAddress chosen =
        choose_advertised_address(options.store_host, store->local_address());
    attr.hostname = chosen.address;
    advertised = chosen.address;
    chosen_by = std::move(chosen.reason);
  }
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
    // "tcp, pci=, iface=lo, speed=-1, addr=[127.0.0.1]": the address is what matters.
    const std::string described = device->str();
    if (const size_t at = described.find("addr="); at != std::string::npos) {
      advertised = described.substr(at + 5);
    }
    context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::milliseconds(options.timeout_ms));
    PrefixedTcpStore gloo_store(*store, key_prefix);
    context->connectFullMesh(gloo_store, device);
  } catch (const Error&) {
    throw;  // the store's own errors already say what and where
  } catch (const std::exception& e) {
    throw CommError(
        fmt::format("gloo group '{}' (rank {} of {}): connecting to the peers failed: {}. This "
                    "rank listens on {} ({}); if the other nodes cannot reach it, name the "
                    "interface they can with `brigade launch --iface NAME` or "
                    "GLOO_SOCKET_IFNAME=NAME",
                    options.group_name, rank, size, e.what(), advertised, chosen_by),
        {});
  }
}

std::shared_ptr<Work> GlooCommunicator::Impl::enqueue(std::string what, int64_t bytes,
                                                      std::function<void(uint32_t)> body) {
  return ops->enqueue(std::move(what), bytes,
                      [this, body = std::move(body)](const OpQueue::Op& op) {
                        running = &op;
                        deadline_ns = now_ns() + options.timeout_ms * 1'000'000;
                        body(static_cast<uint32_t>(op.seq));
                      });
}

std::chrono::milliseconds GlooCommunicator::Impl::wait_timeout() const {
  const int64_t left_ms = (deadline_ns - now_ns()) / 1'000'000;
  return std::chrono::milliseconds(std::max<int64_t>(left_ms, 1));
}

CommError GlooCommunicator::Impl::on_failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::IoException& e) {
    return describe_failure("I/O error", e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return describe_failure("internal check", e.what());
  } catch (const std::exception& e) {
    return describe_failure("error", e.what());
  }
}

CommError GlooCommunicator::Impl::describe_failure(const std::string& kind,
                                                   const std::string& reason) {
  // Peers blocked on this rank now fail at once rather than at their timeout.
  try {
    context->closeConnections();
  } catch (const std::exception&) {
    // Already broken connections may complain; they are closed either way.
  }
  std::vector<int> silent;
  std::string blame;
  try {
    store->set(key_prefix + "failed/" + std::to_string(rank), std::to_string(running->seq));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key_prefix + "failed/" + std::to_string(r));
    try {
      store->wait(keys, kBlameGraceMs);
    } catch (const StoreTimeoutError&) {
      for (int r = 0; r < size; ++r) {
        if (r != rank && !store->check({keys[r]})) silent.push_back(r);
      }
    }
    blame = silent.empty()
                ? "every peer saw the group fail too"
                : fmt::format("peer rank(s) {} did not report within {} ms (stopped, hung or dead)",
                              rank_list(silent), kBlameGraceMs);
  } catch (const std::exception& e) {
    blame = fmt::format("could not ask the store which peers are alive: {}", e.what());
  }
  const bool timed_out =
      reason.find("Timed out") != std::string::npos || reason.find("imeout") != std::string::npos;
  return CommError(
      fmt::format("gloo {} on group '{}' seq {} (rank {} of {}) failed: {}{}: {}; {}",
                  running->what, options.group_name, running->seq, rank, size,
                  timed_out ? fmt::format("timed out after {} ms, ", options.timeout_ms) : "", kind,
                  reason, blame),
      std::move(silent));
}

void GlooCommunicator::Impl::all_reduce(std::byte* data, int64_t count, DType dtype, ReduceOp op,
                                        uint32_t tag) {
  if (count == 0) return;  // every rank passes the same count: nothing to exchange
  visit_dtype(dtype, [&]<typename T>(std::type_identity<T>) {
    T* typed = reinterpret_cast<T*>(data);
    using ReduceFn = void (*)(void*, const void*, const void*, size_t);
    gloo::AllreduceOptions opts(context);
    opts.setOutput(typed, static_cast<size_t>(count));  // in place: output is the input too
    opts.setReduceFunction(op == ReduceOp::kMax ? static_cast<ReduceFn>(&gloo::max<T>)
                                                : static_cast<ReduceFn>(&gloo::sum<T>));
    opts.setTag(tag);
    opts.setTimeout(wait_timeout());
    gloo::allreduce(opts);
    if (op == ReduceOp::kAvg) divide_by(typed, count, size);
  });
}

void GlooCommunicator::Impl::reduce_scatter(const std::byte* input, std::byte* output,
                                            int64_t count, DType dtype, ReduceOp op, uint32_t tag) {
  if (count == 0) return;
  const size_t segment_bytes = static_cast<size_t>(count * dtype_bytes(dtype));
  // received[k] holds the k-th peer's (in rank order, skipping me) copy of my segment.
  std::vector<std::byte> received(segment_bytes * (size - 1));
  if (size > 1) {
    auto send_buffer =
        context->createUnboundBuffer(const_cast<std::byte*>(input), segment_bytes * size);
    auto recv_buffer = context->createUnboundBuffer(received.data(), received.size());
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    for (int p = 0, k = 0; p < size; ++p) {
      if (p != rank) recv_buffer->recv(p, slot, (k++) * segment_bytes, segment_bytes);
    }
    for (int p = 0; p < size; ++p) {
      if (p != rank) send_buffer->send(p, slot, p * segment_bytes, segment_bytes);
    }
    for (int i = 0; i < size - 1; ++i) {
      if (!recv_buffer->waitRecv(wait_timeout())) throw gloo::IoException("receive aborted");
    }
    for (int i = 0; i < size - 1; ++i) {
      if (!send_buffer->waitSend(wait_timeout())) throw gloo::IoException("send aborted");
    }
  }
  if (output != input + rank * segment_bytes) {
    std::memcpy(output, input + rank * segment_bytes, segment_bytes);
  }
  visit_dtype(dtype, [&]<typename T>(std::type_identity<T>) {
    T* out = reinterpret_cast<T*>(output);
    for (int k = 0; k < size - 1; ++k) {
      const T* in = reinterpret_cast<const T*>(received.data() + k * segment_bytes);
      if (op == ReduceOp::kMax) {
        gloo::max<T>(out, in, static_cast<size_t>(count));
      } else {
        gloo::sum<T>(out, in, static_cast<size_t>(count));
      }
    }
    if (op == ReduceOp::kAvg) divide_by(out, count, size);
  });
}

void GlooCommunicator::Impl::all_gather(const std::byte* input, std::byte* output, int64_t count,
                                        DType dtype, uint32_t tag) {
  if (count == 0) return;
  // Gathering moves bytes only, so it runs on bytes whatever the dtype.
  const size_t bytes = static_cast<size_t>(count * dtype_bytes(dtype));
  auto* in = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(input));
  gloo::AllgatherOptions opts(context);
  // In place (input is my segment of output): Gloo takes that as no input.
  if (input != output + rank * bytes) opts.setInput(in, bytes);
  opts.setOutput(reinterpret_cast<uint8_t*>(output), bytes * size);
  opts.setTag(tag);
  opts.setTimeout(wait_timeout());
  gloo::allgather(opts);
}

void GlooCommunicator::Impl::broadcast(std::byte* data, int64_t count, DType dtype, int root,
                                       uint32_t tag) {
  if (count == 0) return;
  const size_t bytes = static_cast<size_t>(count * dtype_bytes(dtype));
  gloo::BroadcastOptions opts(context);
  opts.setOutput(reinterpret_cast<uint8_t*>(data), bytes);  // the root sends from it too
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setTimeout(wait_timeout());
  gloo::broadcast(opts);
}

void GlooCommunicator::Impl::barrier(uint32_t tag) {
  gloo::BarrierOptions opts(context);
  opts.setTag(tag);
  opts.setTimeout(wait_timeout());
  gloo::barrier(opts);
}

std::shared_ptr<Work> GlooCommunicator::Impl::point_to_point(bool is_send, const std::byte* data,
                                                             int64_t bytes, int peer, uint32_t tag,
                                                             std::string what) {
  if (peer < 0 || peer >= size || peer == rank) {
    throw_error("gloo {} on group '{}' (rank {} of {}): peer {} must be another rank of the group",
                what, options.group_name, rank, size, peer);
  }
  reap_finished_waiters(false);
  auto work = std::make_shared<Work>();
  auto copy = is_send ? std::make_shared<std::vector<std::byte>>(data, data + bytes) : nullptr;
  std::byte* target = is_send ? copy->data() : const_cast<std::byte*>(data);
  // Gloo refuses null buffers; an empty message still needs its frame.
  static std::byte empty_message;
  if (bytes == 0) target = &empty_message;
  std::lock_guard<std::mutex> lock(waiters_mutex);
  const uint64_t record = FlightRecorder::global().scheduled(
      ops->flight_group(), RecordKind::kPointToPoint, next_p2p_seq++, "gloo", what, bytes);
  auto buffer = context->createUnboundBuffer(target, static_cast<size_t>(bytes));
  const uint64_t slot = gloo::Slot::build(kPointToPointSlotPrefix, tag);
  FlightRecorder::global().started(record);
  if (is_send) {
    buffer->send(peer, slot, 0, static_cast<size_t>(bytes));
  } else {
    buffer->recv(peer, slot, 0, static_cast<size_t>(bytes));
  }
  gloo::transport::UnboundBuffer* raw = buffer.get();
  waiters.push_back(Waiter{{}, std::move(buffer), work});
  waiters.back().thread =
      std::thread([this, raw, is_send, peer, record, work, copy, what = std::move(what)] {
        std::string failure;
        try {
          const auto timeout = std::chrono::milliseconds(options.timeout_ms);
          const bool done = is_send ? raw->waitSend(timeout) : raw->waitRecv(timeout);
          if (!done) failure = "aborted: the communicator was destroyed";
        } catch (const std::exception& e) {
          const std::string reason = e.what();
          failure = reason.find("imeout") != std::string::npos ||
                            reason.find("Timed out") != std::string::npos
                        ? fmt::format("timed out after {} ms: peer rank {} did not {}: {}",
                                      options.timeout_ms, peer,
                                      is_send ? "take the data" : "send it", reason)
                        : fmt::format("peer rank {}: {}", peer, reason);
        }
        if (failure.empty()) {
          FlightRecorder::global().completed(record);
          work->finish();
          return;
        }
        CommError error(fmt::format("gloo {} on group '{}' (rank {} of {}) failed: {}", what,
                                    options.group_name, rank, size, failure),
                        {peer});
        FlightRecorder::global().failed(record, error.what());
        try {
          FlightRecorder::global().dump_to_run_dir();
        } catch (const std::exception&) {
          // The communication error is what the caller must see.
        }
        // An eager send's caller has moved on; its failure still shows in the
        // flight recorder and in the peer's recv.
        work->finish(std::make_exception_ptr(std::move(error)));
      });
  if (!is_send) return work;
  // The data has left the caller's buffer: the send is done for the caller,
  // while `work` tracks the transfer for the destructor.
  auto sent = std::make_shared<Work>();
  sent->finish();
  return sent;
}

void GlooCommunicator::Impl::reap_finished_waiters(bool all) {
  std::lock_guard<std::mutex> lock(waiters_mutex);
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (all && !it->work->test()) {
      it->buffer->abortWaitSend();
      it->buffer->abortWaitRecv();
    }
    if (all || it->work->test()) {
      it->thread.join();
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
}

GlooCommunicator::GlooCommunicator(GlooCommunicatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->connect();
  Impl* impl = impl_.get();
  impl->ops = std::make_unique<OpQueue>(
      "gloo", impl->options.group_name, impl->rank, impl->size,
      [impl](const OpQueue::Op&, std::exception_ptr e) { return impl->on_failure(std::move(e)); },
      impl->options.world_ranks);
  impl->ops->start();
}

GlooCommunicator::~GlooCommunicator() = default;

int GlooCommunicator::rank() const {
  return impl_->rank;
}
int GlooCommunicator::size() const {
  return impl_->size;
}
const std::string& GlooCommunicator::group_name() const {
  return impl_->options.group_name;
}
int64_t GlooCommunicator::timeout_ms() const {
  return impl_->options.timeout_ms;
}

std::shared_ptr<Work> GlooCommunicator::all_reduce(void* data, int64_t count, DType dtype,
                                                   ReduceOp op) {
  describe::check_operand("gloo", data, count, "all_reduce");
  auto* bytes = static_cast<std::byte*>(data);
  return impl_->enqueue(describe::all_reduce(count, dtype, op), count * dtype_bytes(dtype),
                        [impl = impl_.get(), bytes, count, dtype, op](uint32_t tag) {
                          impl->all_reduce(bytes, count, dtype, op, tag);
                        });
}

std::shared_ptr<Work> GlooCommunicator::reduce_scatter(const void* input, void* output,
                                                       int64_t count, DType dtype, ReduceOp op) {
  describe::check_operand("gloo", input, count, "reduce_scatter");
  describe::check_operand("gloo", output, count, "reduce_scatter");
  auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  return impl_->enqueue(describe::reduce_scatter(count, dtype, op),
                        count * impl_->size * dtype_bytes(dtype),
                        [impl = impl_.get(), in, out, count, dtype, op](uint32_t tag) {
                          impl->reduce_scatter(in, out, count, dtype, op, tag);
                        });
}

std::shared_ptr<Work> GlooCommunicator::all_gather(const void* input, void* output, int64_t count,
                                                   DType dtype) {
  describe::check_operand("gloo", input, count, "all_gather");
  describe::check_operand("gloo", output, count, "all_gather");
  auto* in = static_cast<const std::byte*>(input);
  auto* out = static_cast<std::byte*>(output);
  return impl_->enqueue(describe::all_gather(count, dtype), count * dtype_bytes(dtype),
                        [impl = impl_.get(), in, out, count, dtype](uint32_t tag) {
                          impl->all_gather(in, out, count, dtype, tag);
                        });
}

std::shared_ptr<Work> GlooCommunicator::broadcast(void* data, int64_t count, DType dtype,
                                                  int root) {
  describe::check_operand("gloo", data, count, "broadcast");
  if (root < 0 || root >= impl_->size) {
    throw_error("gloo broadcast on group '{}': root {} is not in a group of size {}",
                impl_->options.group_name, root, impl_->size);
  }
  auto* bytes = static_cast<std::byte*>(data);
  return impl_->enqueue(describe::broadcast(count, dtype, root), count * dtype_bytes(dtype),
                        [impl = impl_.get(), bytes, count, dtype, root](uint32_t tag) {
                          impl->broadcast(bytes, count, dtype, root, tag);
                        });
}

std::shared_ptr<Work> GlooCommunicator::send(const void* data, int64_t count, DType dtype, int peer,
                                             uint32_t tag) {
  describe::check_operand("gloo", data, count, "send");
  return impl_->point_to_point(true, static_cast<const std::byte*>(data),
                               count * dtype_bytes(dtype), peer, tag,
                               describe::send(count, dtype, peer, tag));
}

std::shared_ptr<Work> GlooCommunicator::recv(void* data, int64_t count, DType dtype, int peer,
                                             uint32_t tag) {
  describe::check_operand("gloo", data, count, "recv");
  return impl_->point_to_point(false, static_cast<const std::byte*>(data),
                               count * dtype_bytes(dtype), peer, tag,
                               describe::recv(count, dtype, peer, tag));
}

std::shared_ptr<Work> GlooCommunicator::barrier() {
  return impl_->enqueue("barrier", 0, [impl = impl_.get()](uint32_t tag) { impl->barrier(tag); });
}

}  // namespace brigade
