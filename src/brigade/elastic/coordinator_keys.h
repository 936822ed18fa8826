// The coordinator's store keys and value formats (elastic/coordinator.h
// lists the keys), shared by coordinator.cc and coordinator_standby.cc; not
// for other users: they go through Coordinator.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/elastic/incidents.h"

namespace brigade::elastic::detail {

std::string beat_key(int node);
std::string reports_key(int64_t g);
std::string failure_key(int64_t g, int node);
std::string stopped_key(int64_t g, int node);
std::string cause_key(int64_t g);
std::string open_key(int64_t g);
const std::string& end_key();
std::string lost_key(int node);
std::string replaced_key(int64_t g, int node);
std::string node_fault_key(int64_t g, int node);
std::string members_key(int64_t g);
// gen/<g>/train_layout: "DP GRAD_ACCUM", the leader's scaled `brigade
// train` layout of a generation on fewer nodes.
std::string train_layout_key(int64_t g);
// gen/<g>/worker_store: "HOST:PORT", the store generation g's workers meet
// in (its leader's launcher's).
std::string worker_store_key(int64_t g);
// gen/<g>/restarts: the restarts the job used up to generation g, when
// rejoins (which use none) came before; node/<n>/rejoined: the generation
// a joiner took node n back from (elastic/coordinator_rejoin.cc).
std::string restarts_key(int64_t g);
std::string rejoined_key(int node);

// gen/<g>/members: the nodes of generation g, their original ranks in
// order, space-separated ("0 2"); a node's rank in g is its position.
std::string members_text(const std::vector<int>& members);
// Throws MalformedValue unless the nodes are increasing, within
// 0..nnodes-1, node 0 first. node0_optional (an electing store,
// CoordinatorStore::elects_leader()): node 0 may be left out, as another
// node can lead; over TCP node 0 holds the store, so it is always there.
std::vector<int> parse_members(const std::string& key, const std::string& value, int nnodes,
                               bool node0_optional);

// Throw MalformedValue for a value no agent of the job would write.
int64_t parse_count(const std::string& key, const std::string& value);
nlohmann::json parse_object(const std::string& key, const std::string& value, const char* expected);
// A failure report as it travels between agents. Times are per node, so
// only the detection delay travels: the reader places it on its own clock
// (parse_report's now_ns). "nodes" (the job went on with fewer) must be
// within 1..nnodes.
nlohmann::json report_json(const Incident& i);
Incident parse_report(const std::string& key, const nlohmann::json& j, int64_t now_ns, int nnodes);

}  // namespace brigade::elastic::detail
