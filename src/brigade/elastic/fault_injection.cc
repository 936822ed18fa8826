#include "brigade/elastic/fault_injection.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "brigade/core/error.h"
#include "brigade/core/philox.h"
#include "brigade/elastic/heartbeat.h"

namespace brigade::elastic {
namespace {

constexpr const char* kForm =
    "KIND:rank=R:step=S[:gen=G] with KIND kill, stop, skip, mismatch or sdc, "
    "sdc:rank=R:step=S[:when=forward][:what=moment|grad], nan:rank=R:step=S[:times=N][:gen=G], "
    "slow:rank=R:factor=F[:gen=G], or "
    "chaos:mtbf=SECONDS[:kinds=kill+stop+partition+kill-agent][:seed=N], several "
    "separated by commas (for example "
    "kill:rank=1:step=5,stop:rank=2:step=8,slow:rank=3:factor=2)";

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

int64_t parse_number(std::string_view fault, std::string_view key, std::string_view text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0 ||
      value > (int64_t{1} << 40)) {
    throw_error("fault '{}': {} wants a non-negative integer, got '{}'; the form is {}", fault, key,
                text, kForm);
  }
  return value;
}

InjectedFault parse_one(std::string_view text) {
  const std::vector<std::string_view> fields = split(text, ':');
  InjectedFault fault;
  if (fields[0] == "kill") {
    fault.kind = InjectedFault::Kind::kKill;
  } else if (fields[0] == "stop") {
    fault.kind = InjectedFault::Kind::kStop;
  } else if (fields[0] == "skip") {
    fault.kind = InjectedFault::Kind::kSkip;
  } else if (fields[0] == "mismatch") {
    fault.kind = InjectedFault::Kind::kMismatch;
  } else if (fields[0] == "slow") {
    fault.kind = InjectedFault::Kind::kSlow;
  } else if (fields[0] == "sdc") {
    fault.kind = InjectedFault::Kind::kSdc;
  } else if (fields[0] == "nan") {
    fault.kind = InjectedFault::Kind::kNan;
  } else if (fields[0] == "kill-agent" || fields[0] == "partition" || fields[0] == "hold") {
    throw_error(
        "fault '{}': {} is a whole node's fault, raised by its agent: pass it to `brigade launch "
        "--inject`, not to the workers",
        text, fields[0]);
  } else {
    throw_error(
        "fault '{}': unknown kind '{}' (this build injects kill, stop, skip, mismatch, slow, sdc, "
        "nan and chaos; kill-agent and partition through brigade launch); the form is {}",
        text, fields[0], kForm);
  }
  const bool slow = fault.kind == InjectedFault::Kind::kSlow;
  const bool nan = fault.kind == InjectedFault::Kind::kNan;
  const bool sdc = fault.kind == InjectedFault::Kind::kSdc;
  bool has_rank = false, has_step = false, has_factor = false, has_times = false, has_when = false;
  for (size_t i = 1; i < fields.size(); ++i) {
    const size_t eq = fields[i].find('=');
    const std::string_view key = fields[i].substr(0, eq);
    if (eq == std::string_view::npos) {
      throw_error("fault '{}': '{}' is not key=value; the form is {}", text, fields[i], kForm);
    }
    if (key == "when" && sdc && !has_when) {
      const std::string_view when = fields[i].substr(eq + 1);
      if (when != "forward" && when != "after") {
        throw_error(
            "fault '{}': when= is forward (during the step's forward) or after (after "
            "its update, the default), not '{}'; the form is {}",
            text, when, kForm);
      }
      fault.in_forward = when == "forward";
      has_when = true;
      continue;
    }
    if (key == "what" && sdc && !fault.in_moment && !fault.in_grad) {
      const std::string_view what = fields[i].substr(eq + 1);
      if (what != "moment" && what != "grad") {
        throw_error(
            "fault '{}': what= is moment (a bit of an Adam moment, not a parameter) or grad (a "
            "bit of the rank's local gradient, before the reduce), not '{}'; the form is {}",
            text, what, kForm);
      }
      fault.in_moment = what == "moment";
      fault.in_grad = what == "grad";
      continue;
    }
    if (key == "when" || key == "what") {
      throw_error("fault '{}': unknown or repeated key '{}'; the form is {}", text, key, kForm);
    }
    const int64_t value = parse_number(text, key, fields[i].substr(eq + 1));
    if (key == "rank" && !has_rank) {
      fault.rank = static_cast<int>(value);
      has_rank = true;
    } else if (key == "factor" && slow && !has_factor) {
      fault.factor = value;
      has_factor = true;
    } else if (key == "step" && !slow && !has_step) {
      fault.step = value;
      has_step = true;
    } else if (key == "times" && nan && !has_times) {
      fault.times = value;
      has_times = true;
    } else if (key == "gen") {
      fault.generation = value;
    } else {
      throw_error("fault '{}': unknown or repeated key '{}'; the form is {}", text, key, kForm);
    }
  }
  if (slow) {
    if (!has_rank || !has_factor || fault.factor < 1) {
      throw_error("fault '{}' needs rank= and factor= (1 or more); the form is {}", text, kForm);
    }
    return fault;
  }
  if (fault.in_grad && fault.in_forward) {
    throw_error(
        "fault '{}': what=grad flips the local gradient after the step's backward; when= does not "
        "apply to it (leave it out); the form is {}",
        text, kForm);
  }
  if (nan && fault.times < 1) {
    throw_error("fault '{}': times= wants 1 or more NaN losses; the form is {}", text, kForm);
  }
  if (!has_rank || !has_step || fault.step < 1) {
    throw_error("fault '{}' needs rank= and step= (a step from 1 on); the form is {}", text, kForm);
  }
  return fault;
}

bool is_chaos(std::string_view part) {
  return part.starts_with("chaos:") || part == "chaos";
}

constexpr const char* kNodeForm =
    "kill-agent:node=N:step=S[:gen=G], partition:node=N:step=S[:gen=G] or "
    "hold:node=N:step=S[:gen=G] (and at most one "
    "chaos:mtbf=SECONDS[:kinds=kill+stop+partition+kill-agent][:seed=N]), "
    "separated by commas";

NodeFault parse_node_fault(std::string_view text) {
  const std::vector<std::string_view> fields = split(text, ':');
  NodeFault fault;
  if (fields[0] == "kill-agent") {
    fault.kind = NodeFault::Kind::kKillAgent;
  } else if (fields[0] == "partition") {
    fault.kind = NodeFault::Kind::kPartition;
  } else if (fields[0] == "hold") {
    fault.kind = NodeFault::Kind::kHold;
  } else {
    throw_error(
        "launch --inject takes only "
        "chaos:mtbf=SECONDS[:kinds=kill+stop+partition+kill-agent][:seed=N] (at most one), "
        "kill-agent:node=N:step=S[:gen=G], partition:node=N:step=S[:gen=G] and "
        "hold:node=N:step=S[:gen=G], got '{}': the "
        "other faults are raised by brigade train's workers themselves; pass them to `brigade "
        "train --inject`",
        text);
  }
  bool has_node = false, has_step = false, has_gen = false;
  for (size_t i = 1; i < fields.size(); ++i) {
    const size_t eq = fields[i].find('=');
    if (eq == std::string_view::npos) {
      throw_error("fault '{}': '{}' is not key=value; the form is {}", text, fields[i], kNodeForm);
    }
    const std::string_view key = fields[i].substr(0, eq);
    const int64_t value = parse_number(text, key, fields[i].substr(eq + 1));
    if (key == "node" && !has_node) {
      fault.node = static_cast<int>(value);
      has_node = true;
    } else if (key == "step" && !has_step) {
      fault.step = value;
      has_step = true;
    } else if (key == "gen" && !has_gen) {
      fault.generation = value;
      has_gen = true;
    } else {
      throw_error("fault '{}': unknown or repeated key '{}'; the form is {}", text, key, kNodeForm);
    }
  }
  if (!has_node || !has_step || fault.step < 1) {
    throw_error("fault '{}' needs node= and step= (a step from 1 on); the form is {}", text,
                kNodeForm);
  }
  return fault;
}

ChaosSpec parse_chaos_part(std::string_view text) {
  const std::vector<std::string_view> fields = split(text, ':');
  ChaosSpec spec;
  bool has_mtbf = false, has_kinds = false, has_seed = false;
  for (size_t i = 1; i < fields.size(); ++i) {
    const size_t eq = fields[i].find('=');
    if (eq == std::string_view::npos) {
      throw_error("fault '{}': '{}' is not key=value; the form is {}", text, fields[i], kForm);
    }
    const std::string_view key = fields[i].substr(0, eq);
    const std::string_view value = fields[i].substr(eq + 1);
    if (key == "mtbf" && !has_mtbf) {
      const std::string copy(value);
      char* end = nullptr;
      spec.mtbf_s = std::strtod(copy.c_str(), &end);
      if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(spec.mtbf_s) ||
          spec.mtbf_s < 0.1) {
        throw_error(
            "fault '{}': mtbf wants the mean seconds between faults, at least 0.1, got '{}'; the "
            "form is {}",
            text, value, kForm);
      }
      has_mtbf = true;
    } else if (key == "kinds" && !has_kinds) {
      spec.kill = spec.stop = false;
      for (std::string_view kind : split(value, '+')) {
        if (kind == "kill") {
          spec.kill = true;
        } else if (kind == "stop") {
          spec.stop = true;
        } else if (kind == "partition") {
          spec.partition = true;
        } else if (kind == "kill-agent") {
          spec.kill_agent = true;
        } else {
          throw_error(
              "fault '{}': chaos kinds are kill, stop, partition and kill-agent, separated by '+' "
              "(kinds=kill+stop), got '{}'",
              text, kind);
        }
      }
      has_kinds = true;
    } else if (key == "seed" && !has_seed) {
      spec.seed = static_cast<uint64_t>(parse_number(text, key, value));
      has_seed = true;
    } else {
      throw_error("fault '{}': unknown or repeated key '{}'; the form is {}", text, key, kForm);
    }
  }
  if (!has_mtbf) throw_error("fault '{}' needs mtbf=SECONDS; the form is {}", text, kForm);
  return spec;
}

}  // namespace

std::vector<InjectedFault> parse_faults(std::string_view spec) {
  std::vector<InjectedFault> faults;
  if (spec.empty()) return faults;
  parse_chaos(spec);  // checked here too: the workers parse the spec before the agent acts on it
  for (std::string_view part : split(spec, ',')) {
    if (!is_chaos(part)) faults.push_back(parse_one(part));
  }
  return faults;
}

std::vector<NodeFault> parse_node_faults(std::string_view spec) {
  std::vector<NodeFault> faults;
  if (spec.empty()) return faults;
  parse_chaos(spec);
  for (std::string_view part : split(spec, ',')) {
    if (!is_chaos(part)) faults.push_back(parse_node_fault(part));
  }
  return faults;
}

std::optional<ChaosSpec> parse_chaos(std::string_view spec) {
  std::optional<ChaosSpec> chaos;
  if (spec.empty()) return chaos;
  for (std::string_view part : split(spec, ',')) {
    if (!is_chaos(part)) continue;
    if (chaos) throw_error("inject spec '{}' has more than one chaos part; give one", spec);
    chaos = parse_chaos_part(part);
  }
  return chaos;
}

ChaosSchedule::ChaosSchedule(const ChaosSpec& spec, int node, int nnodes, int64_t incarnation)
    : spec_(spec),
      stream_(static_cast<uint64_t>(node) | (static_cast<uint64_t>(incarnation) << 32)),
      mean_s_(spec.mtbf_s * std::max(1, nnodes)) {
  // kill before stop: with those two alone, the draw is the one runs
  // before the whole-node kinds made (seeds keep their faults).
  if (spec.kill) kinds_.push_back(Kind::kKill);
  if (spec.stop) kinds_.push_back(Kind::kStop);
  if (node != 0 && spec.partition) kinds_.push_back(Kind::kPartition);
  if (node != 0 && spec.kill_agent) kinds_.push_back(Kind::kKillAgent);
}

ChaosSchedule::Fault ChaosSchedule::next() {
  const Philox::Block b = Philox::block(spec_.seed, stream_, static_cast<uint64_t>(index_++));
  // (0, 1]: never log(0).
  const double u = (static_cast<double>(b[0]) + 1.0) / 4294967296.0;
  Fault f;
  f.after_ns = static_cast<int64_t>(-std::log(u) * mean_s_ * 1e9);
  if (!kinds_.empty()) f.kind = kinds_[b[1] % kinds_.size()];
  f.victim = (uint64_t{b[2]} << 32) | b[3];
  return f;
}

void ChaosSchedule::start(int64_t start_ns) {
  pending_ = next();
  // Nothing to draw (node 0 of a whole-node-only spec): never due.
  due_ns_ = kinds_.empty() ? INT64_MAX : start_ns + pending_.after_ns;
}

std::optional<ChaosSchedule::Fault> ChaosSchedule::take_due(int64_t now_ns, int* dropped) {
  if (now_ns < due_ns_ || kinds_.empty()) return std::nullopt;
  const Fault fault = pending_;
  for (bool first = true; now_ns >= due_ns_; first = false) {
    if (!first) ++*dropped;
    pending_ = next();
    due_ns_ += pending_.after_ns;
  }
  return fault;
}

const InjectedFault* fault_after_step(const std::vector<InjectedFault>& faults, int rank,
                                      int64_t generation, int64_t step) {
  for (const InjectedFault& f : faults) {
    if (f.kind != InjectedFault::Kind::kSlow && f.kind != InjectedFault::Kind::kNan &&
        !f.in_forward && !f.in_grad && f.rank == rank && f.generation == generation &&
        f.step == step) {
      return &f;
    }
  }
  return nullptr;
}

std::vector<InjectedFault> in_step_faults(const std::vector<InjectedFault>& faults, int rank,
                                          int64_t generation) {
  std::vector<InjectedFault> out;
  for (const InjectedFault& f : faults) {
    if ((f.kind == InjectedFault::Kind::kNan || f.in_forward || f.in_grad) && f.rank == rank &&
        f.generation == generation) {
      out.push_back(f);
    }
  }
  return out;
}

int64_t slow_factor(const std::vector<InjectedFault>& faults, int rank, int64_t generation) {
  for (const InjectedFault& f : faults) {
    if (f.kind == InjectedFault::Kind::kSlow && f.rank == rank && f.generation == generation) {
      return f.factor;
    }
  }
  return 1;
}

void raise_fault(const InjectedFault& fault, WorkerHeartbeat* heartbeat) {
  if (fault.kind == InjectedFault::Kind::kSdc) {
    std::fprintf(stderr,
                 "brigade train: injecting a bit flip in a parameter of rank %d after step %lld "
                 "(generation %lld)\n",
                 fault.rank, static_cast<long long>(fault.step),
                 static_cast<long long>(fault.generation));
    std::fflush(nullptr);
    if (heartbeat != nullptr) heartbeat->fault_injected();
    return;
  }
  if (fault.kind == InjectedFault::Kind::kSkip || fault.kind == InjectedFault::Kind::kMismatch) {
    // Not stamped: the agent learns of it as of any bug, from its symptoms.
    std::fprintf(
        stderr, "brigade train: injecting a %s on rank %d after step %lld (generation %lld)\n",
        fault.kind == InjectedFault::Kind::kSkip ? "skipped collective" : "mismatched collective",
        fault.rank, static_cast<long long>(fault.step), static_cast<long long>(fault.generation));
    std::fflush(nullptr);
    return;
  }
  const bool kill = fault.kind == InjectedFault::Kind::kKill;
  std::fprintf(stderr, "brigade train: injecting %s on rank %d after step %lld (generation %lld)\n",
               kill ? "SIGKILL" : "SIGSTOP", fault.rank, static_cast<long long>(fault.step),
               static_cast<long long>(fault.generation));
  std::fflush(nullptr);
  if (heartbeat != nullptr) heartbeat->fault_injected();
  ::kill(::getpid(), kill ? SIGKILL : SIGSTOP);
}

}  // namespace brigade::elastic
