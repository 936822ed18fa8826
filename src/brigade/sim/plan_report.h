// How `brigade plan` shows its answers: tables for people, JSON for tools.
// Units in JSON keys; memory in GiB, times in seconds.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "brigade/sim/checkpoint_cost.h"
#include "brigade/sim/search.h"
#include "brigade/sim/sweep.h"
#include "brigade/sim/validation.h"

namespace brigade::sim {

nlohmann::json estimate_json(const Estimate& e, const Hardware& hw);
std::string format_estimate(const Workload& job, const Hardware& hw, const Estimate& e);

nlohmann::json search_json(const SearchResult& result, const Hardware& hw);
std::string format_search(const Workload& job, const Hardware& hw, int64_t gpus,
                          const SearchResult& result);

nlohmann::json validation_json(const ValidationSummary& summary);
std::string format_validation(const ValidationSummary& summary);

nlohmann::json sweep_json(const GpuSweep& sweep);
std::string format_sweep(const Workload& job, const Hardware& hw, const GpuSweep& sweep);

}  // namespace brigade::sim
