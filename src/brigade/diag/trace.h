// `brigade train --trace STEPS` (diag.trace): RUN_DIR/trace.json, every
// rank of the job on one timeline, in the Chrome trace format (open it in
// https://ui.perfetto.dev or chrome://tracing).
//
// What it shows, per rank (a "process" named "rank R (node N)"):
//   - on the training thread: each step ("step 12"); its step-clock sections
//     (compute, comm, bubble, data, ckpt, eval: train/step_breakdown.h);
//     inside compute the pipeline executor's work per micro-batch ("forward
//     3", "backward 3", numbered by micro-batch, with the model chunk) and
//     its waits for a peer ("wait activation 3": the bubble), and the
//     model's per layer ("block forward 5", "lm head and loss");
//   - one lane per communication group ("comm dp0", "comm pp0_0"): every
//     collective and send/recv from the flight recorder, from the moment the
//     rank called it to its completion, with its group and sequence number
//     (the same operation has the same (group, seq) on every rank);
//   - the background checkpoint or snapshot writer's lanes ("write
//     checkpoint 4", "write snapshot 5");
//   - alarms raised in the window (a straggler named) as instants.
//
// Clocks: ranks on one machine (network namespaces included) read one
// monotonic clock, which is what they share when their kernels' boot ids
// agree; times are then exact. Otherwise each rank's offset from rank 0 is
// estimated from eight barrier-and-exchange rounds (the median; its error is
// the barrier's release skew) and the file says which was used.
//
// For tests of that estimate on one machine: with BRIGADE_TRACE_CLOCK_SKEW_NS
// = S set, rank R's times are read as if its clock ran R x S ns ahead, and
// the exchange is used.
//
// Writing is collective: at the window's last step every rank writes its
// part (trace.rank<R>.part.json, in the run directory every node shares),
// and rank 0 joins the parts into trace.json and removes them. It is also
// best effort: a part that cannot be written or read is said in one line on
// stderr, and training goes on without the file. Times start at 0, the
// earliest event of any rank (otherData's origin_unix_us: that instant on
// the wall clock). When the run ends the launcher marks its incidents and
// straggler episodes in it (diag/trace_incidents.h). In the viewers a rank is process R + 1 (0 is
// the kernel's idle task to Perfetto), named "rank R (node N)".
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace brigade {
class Communicator;
}

namespace brigade::diag {

inline constexpr char kSkewVariable[] = "BRIGADE_TRACE_CLOCK_SKEW_NS";
// otherData's key of the unix time (us) of the file's time 0, and of the
// boot id of the machine whose monotonic clock the times are (rank 0's).
inline constexpr char kOriginKey[] = "origin_unix_us";
inline constexpr char kBootIdKey[] = "boot_id";

// Moves every event's time by `by_us`: "ts", and a collective's "called_us"
// in its args. The join's zero, and diag/trace_incidents.h's when a mark
// moves it.
void shift_trace_events(nlohmann::json& events, double by_us);

// A generation's trace in the run directory: trace.json, and
// trace.genG.json for the generation G a restart started (its own window).
std::string trace_file_name(int64_t generation);
// Whether `name` is some generation's trace_file_name.
bool is_trace_file_name(std::string_view name);

// Steps first..last, counted from 1, both included.
struct TraceSteps {
  int64_t first = 0;
  int64_t last = 0;
};

// "A:B" (steps A to B) or "N" (the first N steps this run takes, after
// `start_step`, where it resumed). Throws Error naming the expected form.
TraceSteps parse_trace_steps(std::string_view spec, int64_t start_step);

class TraceWindow {
 public:
  // Writes run_dir/file_name. `world`: every rank's group (null for one
  // process). Call from the training thread: its events are the "train"
  // lane.
  TraceWindow(TraceSteps steps, std::filesystem::path run_dir, std::string file_name,
              Communicator* world, int world_rank, std::string node);

  // Before step `step` (from 1) starts.
  void before_step(int64_t step);
  // After step `step` completed; every rank calls it at the same steps. At
  // the window's last step this writes the trace (collective).
  void after_step(int64_t step);
  // The run ends (its last step, or a stop every rank agreed on): a window
  // still open is written now, with the steps it saw (collective).
  void finish();

  TraceSteps steps() const { return steps_; }
  // trace.json once written (rank 0; empty on the other ranks).
  const std::filesystem::path& written() const { return written_; }

 private:
  void write();

  TraceSteps steps_;
  std::filesystem::path run_dir_;
  std::string file_name_;
  Communicator* world_;
  int world_rank_;
  std::string node_;
  int train_thread_ = 0;
  bool open_ = false;
  bool done_ = false;
  int64_t opened_ns_ = 0;
  int64_t step_begin_ns_ = 0;
  std::filesystem::path written_;
};

}  // namespace brigade::diag
