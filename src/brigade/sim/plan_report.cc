#include "brigade/sim/plan_report.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "brigade/sim/transformer_formulas.h"

namespace brigade::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string job_line(const Workload& job, const Hardware& hw) {
  const double params = model_params(job.model, job.seq_len);
  return fmt::format(
      "model: {} layers, hidden {}, {} heads, vocab {} = {}; sequence {}, global batch {} ({} "
      "tokens)\nhardware: {}\n",
      job.model.n_layer, job.model.n_embd, job.model.n_head, job.model.vocab_size,
      params >= 1e9 ? fmt::format("{:.2f}B parameters", params / 1e9)
                    : fmt::format("{:.2f}M parameters", params / 1e6),
      job.seq_len, job.global_batch, job.global_batch * job.seq_len, hw.description);
}

std::string layout_cell(const Layout& l) {
  return fmt::format("{:>2} {:>3} {:>5} {:>2} {:>4} {:>5} {:>9} {:>3} {:>11}", l.tp, l.pp, l.dp,
                     l.vp, l.zero, l.micro, plan_recompute_name(l.recompute), l.sp ? "yes" : "no",
                     schedule::kind_name(l.pipeline_schedule()));
}

const char* kLayoutHeader = "tp  pp    dp vp zero micro recompute  sp    schedule";

std::string estimate_row(const Estimate& e) {
  const TimeEstimate& t = e.time;
  const MemoryEstimate& m = e.memory;
  return fmt::format(
      "{} | {:5.1f} {:5.1f} {:5.1f} {:5.1f} {:5.1f} | {:8.3f} {:7.3f} {:6.3f} {:6.3f} {:6.3f} "
      "{:6.3f} | {:5.1f}% {:10.0f}\n",
      layout_cell(e.layout), m.params / kGiB, m.grads / kGiB, m.optimizer / kGiB,
      m.activations / kGiB, m.total() / kGiB, t.step_s(), t.compute_s, t.tp_comm_s, t.pp_comm_s,
      t.dp_exposed_s, t.bubble_s, 100.0 * e.mfu, e.tokens_per_s);
}

std::string table_header() {
  return fmt::format(
      "{} | memory per GPU, GiB              | time per step, s                              "
      "|\n{} |    wt  grad optim  acts total |     step compute     tp     pp dp exp bubble |  "
      " MFU   tokens/s\n",
      std::string(std::string(kLayoutHeader).size(), ' '), kLayoutHeader);
}

}  // namespace

nlohmann::json estimate_json(const Estimate& e, const Hardware& hw) {
  const Layout& l = e.layout;
  return {
      {"layout",
       {{"tp", l.tp},
        {"pp", l.pp},
        {"dp", l.dp},
        {"vp", l.vp},
        {"zero", l.zero},
        {"recompute", plan_recompute_name(l.recompute)},
        {"sp", l.sp},
        {"micro", l.micro},
        {"schedule", schedule::kind_name(l.pipeline_schedule())}}},
      {"layout_string", l.to_string()},
      {"fits", e.fits},
      {"num_microbatches", e.num_microbatches},
      {"memory_gib",
       {{"params", e.memory.params / kGiB},
        {"grads", e.memory.grads / kGiB},
        {"optimizer", e.memory.optimizer / kGiB},
        {"activations", e.memory.activations / kGiB},
        {"reserved", e.memory.reserved / kGiB},
        {"total", e.memory.total() / kGiB},
        {"capacity", hw.memory_bytes / kGiB}}},
      {"step_time_s", e.time.step_s()},
      {"time_s",
       {{"compute", e.time.compute_s},
        {"tp_comm", e.time.tp_comm_s},
        {"pp_comm", e.time.pp_comm_s},
        {"dp_exposed", e.time.dp_exposed_s},
        {"dp_total", e.dp_comm_s},
        {"bubble", e.time.bubble_s},
        {"optimizer", e.time.optimizer_s}}},
      {"waiting_fraction", e.time.waiting_s() / e.time.step_s()},
      {"tflops_per_gpu", e.tflops_per_gpu},
      {"mfu", e.mfu},
      {"tokens_per_s", e.tokens_per_s},
  };
}

std::string format_estimate(const Workload& job, const Hardware& hw, const Estimate& e) {
  std::string out = job_line(job, hw);
  out += fmt::format("layout {}: {} micro-batches per step\n", e.layout.to_string(),
                     e.num_microbatches);
  out += fmt::format(
      "memory per GPU: {:.1f} GiB of {:.0f} ({}): weights {:.1f}, gradients {:.1f}, optimizer "
      "{:.1f}, activations {:.1f}, reserved {:.1f}\n",
      e.memory.total() / kGiB, hw.memory_bytes / kGiB, e.fits ? "fits" : "DOES NOT FIT",
      e.memory.params / kGiB, e.memory.grads / kGiB, e.memory.optimizer / kGiB,
      e.memory.activations / kGiB, e.memory.reserved / kGiB);
  const TimeEstimate& t = e.time;
  const double step = t.step_s();
  auto pct = [step](double x) { return 100.0 * x / step; };
  out += fmt::format(
      "step {:.3f} s: compute {:.3f} ({:.1f}%), tp comm {:.3f} ({:.1f}%), pp transfers {:.3f} "
      "({:.1f}%), dp exposed {:.3f} ({:.1f}%) of {:.3f} total, bubble {:.3f} ({:.1f}%), optimizer "
      "{:.3f} ({:.1f}%)\n",
      step, t.compute_s, pct(t.compute_s), t.tp_comm_s, pct(t.tp_comm_s), t.pp_comm_s,
      pct(t.pp_comm_s), t.dp_exposed_s, pct(t.dp_exposed_s), e.dp_comm_s, t.bubble_s,
      pct(t.bubble_s), t.optimizer_s, pct(t.optimizer_s));
  out += fmt::format(
      "{:.1f} TFLOP/s per GPU (recompute counted), MFU {:.1f}%, {:.0f} tokens/s; waiting on "
      "other GPUs {:.1f}% of the step\n",
      e.tflops_per_gpu, 100.0 * e.mfu, e.tokens_per_s, pct(t.waiting_s()));
  return out;
}

nlohmann::json search_json(const SearchResult& result, const Hardware& hw) {
  nlohmann::json ranked = nlohmann::json::array();
  for (const Estimate& e : result.ranked) ranked.push_back(estimate_json(e, hw));
  nlohmann::json losses = nlohmann::json::array();
  for (const LossGroup& g : result.losses) {
    losses.push_back({{"reason", loss_reason_name(g.reason)},
                      {"count", g.count},
                      {"best", estimate_json(g.best, hw)}});
  }
  return {{"evaluated", result.evaluated},
          {"invalid", result.invalid},
          {"common_invalid", result.common_invalid},
          {"fitting", result.fitting},
          {"search_s", result.seconds},
          {"layouts", ranked},
          {"losers", losses}};
}

std::string format_search(const Workload& job, const Hardware& hw, int64_t gpus,
                          const SearchResult& result) {
  std::string out = job_line(job, hw);
  out += fmt::format(
      "{} GPUs: {} layouts evaluated in {:.3f} s ({:.0f}/s), {} fit in {:.0f} GiB, {} "
      "combinations cannot run\n\n",
      gpus, result.evaluated, result.seconds,
      static_cast<double>(result.evaluated) / std::max(result.seconds, 1e-9), result.fitting,
      hw.memory_bytes / kGiB, result.invalid);
  if (result.evaluated == 0) {
    out += fmt::format("no layout can run this job on {} GPUs: {}\n", gpus,
                       result.common_invalid.empty() ? "nothing to search" : result.common_invalid);
  } else if (result.ranked.empty()) {
    out += "no layout fits in memory: use more GPUs, a shorter sequence or a smaller batch\n";
  } else {
    out += "best layouts (total memory includes the reserve for context and buffers)\n" +
           table_header();
    for (const Estimate& e : result.ranked) out += estimate_row(e);
  }
  if (!result.losses.empty()) {
    out += "\nwhy the others lost (the fastest of each group)\n";
    for (const LossGroup& g : result.losses) {
      out += fmt::format("  {:<46} {:>7} layouts, e.g. {}: {:.3f} s, {:.1f} GiB\n",
                         loss_reason_name(g.reason), g.count, g.best.layout.to_string(),
                         g.best.time.step_s(), g.best.memory.total() / kGiB);
    }
  }
  return out;
}

nlohmann::json validation_json(const ValidationSummary& summary) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ValidationRow& r : summary.rows) {
    rows.push_back({{"name", r.run.name},
                    {"hardware", r.run.hardware},
                    {"metric", published_metric_name(r.run.metric)},
                    {"published", r.run.published},
                    {"predicted", r.predicted_ok ? nlohmann::json(r.predicted) : nullptr},
                    {"error", r.predicted_ok ? nlohmann::json(r.error) : nullptr},
                    {"layout", r.predicted_ok ? r.layout.to_string() : ""},
                    {"role", r.run.calibration ? "calibration" : "held-out"},
                    {"source", r.run.source}});
  }
  return {{"rows", rows},
          {"calibration_mean_abs_error", summary.calibration_mean_abs_error},
          {"calibration_max_abs_error", summary.calibration_max_abs_error},
          {"held_out_mean_abs_error", summary.held_out_mean_abs_error},
          {"held_out_max_abs_error", summary.held_out_max_abs_error}};
}

std::string format_validation(const ValidationSummary& summary) {
  std::string out = fmt::format("{:<30} {:<9} {:<15} {:>9} {:>9} {:>7}  {}\n", "run", "hardware",
                                "metric", "published", "predicted", "error", "layout / source");
  for (const ValidationRow& r : summary.rows) {
    const char* metric = published_metric_name(r.run.metric);
    if (!r.predicted_ok) {
      out += fmt::format("{:<30} {:<9} {:<15} {:>9.2f} {:>9} {:>7}  {}\n", r.run.name,
                         r.run.hardware, metric, r.run.published, "no fit", "-", r.run.source);
      continue;
    }
    out += fmt::format("{:<30} {:<9} {:<15} {:>9.2f} {:>9.2f} {:>+6.1f}%  {}{}\n", r.run.name,
                       r.run.hardware, metric, r.run.published, r.predicted, 100.0 * r.error,
                       r.run.calibration ? "" : "[held out] ", r.run.source);
    out += fmt::format("{:<67}  {}\n", "", r.layout.to_string());
  }
  out += fmt::format(
      "\ncalibration rows: mean |error| {:.1f}%, max {:.1f}% (target: mean <= 5%, max <= 10%)\n",
      100.0 * summary.calibration_mean_abs_error, 100.0 * summary.calibration_max_abs_error);
  out +=
      fmt::format("held-out rows:    mean |error| {:.1f}%, max {:.1f}%\n",
                  100.0 * summary.held_out_mean_abs_error, 100.0 * summary.held_out_max_abs_error);
  return out;
}

nlohmann::json sweep_json(const GpuSweep& sweep) {
  nlohmann::json points = nlohmann::json::array();
  for (const SweepPoint& p : sweep.points) {
    nlohmann::json point = {{"gpus", p.gpus}, {"feasible", p.feasible}};
    if (p.feasible) {
      auto summary = [](const Estimate& e) {
        return nlohmann::json{{"layout", e.layout.to_string()},
                              {"step_time_s", e.time.step_s()},
                              {"mfu", e.mfu},
                              {"waiting_fraction", e.time.waiting_s() / e.time.step_s()},
                              {"bubble_fraction", e.time.bubble_s / e.time.step_s()},
                              {"tokens_per_s", e.tokens_per_s}};
      };
      point["fastest"] = summary(p.fastest);
      point["least_waiting"] = summary(p.least_waiting);
    }
    points.push_back(point);
  }
  return {{"points", points}};
}

std::string format_sweep(const Workload& job, const Hardware& hw, const GpuSweep& sweep) {
  std::string out = job_line(job, hw);
  out +=
      "waiting = tp + pp communication, exposed dp communication and bubble, as a share of "
      "the step\n\n";
  out += fmt::format("{:>6} | {:>8} {:>6} {:>8} {:>7} {:>12} | {:<52} | {}\n", "GPUs", "step s",
                     "MFU", "waiting", "bubble", "tokens/s", "fastest layout",
                     "least waiting within 5% of fastest");
  for (const SweepPoint& p : sweep.points) {
    if (!p.feasible) {
      out += fmt::format("{:>6} | no layout fits\n", p.gpus);
      continue;
    }
    const Estimate& e = p.fastest;
    const double step = e.time.step_s();
    const Estimate& w = p.least_waiting;
    out += fmt::format(
        "{:>6} | {:>8.3f} {:>5.1f}% {:>7.1f}% {:>6.1f}% {:>12.0f} | {:<52} | {} "
        "({:.1f}% waiting)\n",
        p.gpus, step, 100.0 * e.mfu, 100.0 * e.time.waiting_s() / step,
        100.0 * e.time.bubble_s / step, e.tokens_per_s, e.layout.to_string(), w.layout.to_string(),
        100.0 * w.time.waiting_s() / w.time.step_s());
  }
  return out;
}

}  // namespace brigade::sim
