#include "brigade/sim/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include "brigade/core/error.h"

namespace brigade::sim {

const char* plan_recompute_name(PlanRecompute r) {
  switch (r) {
    case PlanRecompute::kNone:
      return "none";
    case PlanRecompute::kSelective:
      return "selective";
    case PlanRecompute::kFull:
      return "full";
  }
  return "?";
}

schedule::Kind Layout::pipeline_schedule() const {
  if (vp > 1 && schedule == schedule::Kind::kOneFOneB) return schedule::Kind::kInterleaved;
  return schedule;
}

std::string Layout::to_string() const {
  return fmt::format("tp={},pp={},dp={},vp={},zero={},recompute={},sp={},micro={},schedule={}", tp,
                     pp, dp, vp, zero, plan_recompute_name(recompute), sp ? "true" : "false", micro,
                     schedule::kind_name(pipeline_schedule()));
}

namespace {

int64_t parse_positive(const std::string& key, const std::string& value) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v <= 0) {
    throw_error("--layout: {}={} is not a positive integer", key, value);
  }
  return v;
}

}  // namespace

Layout Layout::parse(const std::string& text) {
  if (text.empty()) throw_error("--layout is empty (e.g. tp=8,pp=8,dp=6,micro=1)");
  Layout layout;
  std::stringstream stream(text);
  std::string item;
  std::vector<std::string> seen;
  while (std::getline(stream, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      throw_error("--layout: \"{}\" is not key=value (e.g. tp=8,pp=8,dp=6,micro=1)", item);
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      throw_error("--layout: {} is given twice", key);
    }
    seen.push_back(key);
    if (key == "tp") {
      layout.tp = parse_positive(key, value);
    } else if (key == "pp") {
      layout.pp = parse_positive(key, value);
    } else if (key == "dp") {
      layout.dp = parse_positive(key, value);
    } else if (key == "vp") {
      layout.vp = parse_positive(key, value);
    } else if (key == "micro") {
      layout.micro = parse_positive(key, value);
    } else if (key == "zero") {
      if (value != "0" && value != "1" && value != "2" && value != "3") {
        throw_error("--layout: zero must be 0, 1, 2 or 3, got {}", value);
      }
      layout.zero = value[0] - '0';
    } else if (key == "recompute") {
      if (value == "none") {
        layout.recompute = PlanRecompute::kNone;
      } else if (value == "selective") {
        layout.recompute = PlanRecompute::kSelective;
      } else if (value == "full") {
        layout.recompute = PlanRecompute::kFull;
      } else {
        throw_error("--layout: recompute must be none, selective or full, got {}", value);
      }
    } else if (key == "sp") {
      if (value != "true" && value != "false") {
        throw_error("--layout: sp must be true or false, got {}", value);
      }
      layout.sp = value == "true";
    } else if (key == "schedule") {
      try {
        layout.schedule = schedule::parse_kind(value);
      } catch (const Error& e) {
        throw_error("--layout: {}", e.what());
      }
    } else {
      throw_error(
          "--layout: unknown key \"{}\" (known: tp, pp, dp, vp, zero, recompute, sp, micro, "
          "schedule)",
          key);
    }
  }
  layout.schedule = layout.pipeline_schedule();
  return layout;
}

SystemFeatures SystemFeatures::megatron_2021() {
  SystemFeatures f;
  f.flash_attention = false;
  f.attention_dropout = true;
  f.overlap_dp = false;
  f.head_backward_in_forward = false;
  f.schedules = {schedule::Kind::kOneFOneB, schedule::Kind::kInterleaved};
  return f;
}

}  // namespace brigade::sim
