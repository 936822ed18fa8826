// The agent's part in a multi-node job: following the coordinator
// (elastic/coordinator.h). Kept apart from agent.cc, which supervises one
// node's workers and is the same on one node and many.
#include <csignal>
#include <cstdio>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/agent.h"

namespace brigade::elastic {
namespace {

constexpr int64_t kTickMs = 100;
constexpr int64_t kNsPerMs = 1'000'000;

}  // namespace

void Agent::follow_job(const JobView& view, WorkerGroup* group) {
  using State = JobView::State;
  if (view.state == State::kFailing || view.state == State::kEnded) {
    if (failing_seen_ns_ == 0) failing_seen_ns_ = now_ns();
  }
  if (view.state == State::kEnded) {
    remote_failure_ = view.why;
    lost_node_ = view.lost_node;
    lost_coordinator_ = view.lost_coordinator;
    record_job_incident(view);
  }
  if (group == nullptr || group->stopping()) return;
  if (view.state == State::kFailing) {
    // A failure on another node (or this one's, already stopping): the
    // survivors' state is disposable, as on one node.
    will_restart_ = view.will_restart && received_signal_ == 0;
    stopped_count_ = group->running();
    if (will_restart_) {
      group->stop(SIGKILL, 0);
    } else {
      group->stop(SIGTERM, options_.failure_grace_ms);
    }
  } else if (view.state == State::kEnded) {
    will_restart_ = false;
    stopped_count_ = group->running();
    // Another launcher's signal: the workers may be writing the interrupt
    // checkpoint, a collective with that node's, which get as long.
    group->stop(SIGTERM, view.signal ? options_.signal_grace_ms : options_.failure_grace_ms);
  }
}

Agent::Outcome Agent::settle_generation(Outcome outcome) {
  using State = JobView::State;
  try {
    coordinator_->report_stopped(outcome == Outcome::kSucceeded);
  } catch (const Error& e) {
    remote_failure_ = fmt::format("lost contact with the coordinator: {}", e.what());
    lost_coordinator_ = options_.node_rank != 0;
    return failure_ ? Outcome::kFailed : Outcome::kRemoteFailure;
  }
  if (outcome == Outcome::kSignalled) return outcome;
  const sigset_t watched = watched_signals();
  for (;;) {
    const JobView view = coordinator_->poll(now_ns());
    follow_job(view, nullptr);
    switch (view.state) {
      case State::kSucceeded:
        return Outcome::kSucceeded;
      case State::kRestart:
        record_job_incident(view);
        coordinator_->enter_next_generation();
        if (!failure_ || view.cause->node != options_.node_rank) {
          Incident cause = *view.cause;
          cause.what = fmt::format("node {}: {}", cause.node, cause.what);
          failure_ = cause;
        }
        will_restart_ = true;
        failing_seen_ns_ = 0;
        return Outcome::kFailed;
      case State::kEnded:
        // This node's own failure, the job's cause, is said as on one node.
        if (failure_ && view.cause && view.cause->node == options_.node_rank &&
            view.cause->rank == failure_->rank) {
          will_restart_ = false;
          return Outcome::kFailed;
        }
        return Outcome::kRemoteFailure;
      case State::kRunning:
      case State::kFailing:
        break;
    }
    // The other nodes are still stopping (or still training): look again
    // soon, and take the user's signal meanwhile.
    const timespec tick{0, kTickMs * kNsPerMs};
    const int sig = ::sigtimedwait(&watched, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      received_signal_ = sig;
      stopped_count_ = 0;
      report_end(
          fmt::format("the launcher of node {} received {}", options_.node_rank, signal_name(sig)));
      return Outcome::kSignalled;
    }
  }
}

void Agent::record_job_incident(const JobView& view) {
  if (!view.cause) return;
  if (!incidents_.empty() && incidents_.back().generation == generation_) return;
  Incident incident = *view.cause;
  incident.generation = generation_;
  // This node's own report has its own clock's times; another node's
  // carries only how long its detection took, placed where this agent
  // first saw the generation fail.
  if (failure_ && incident.node == options_.node_rank && incident.rank == failure_->rank) {
    incident.fault_ns = failure_->fault_ns;
    incident.detected_ns = failure_->detected_ns;
  } else {
    const int64_t seen = failing_seen_ns_ != 0 ? failing_seen_ns_ : now_ns();
    incident.fault_ns += seen;
    incident.detected_ns += seen;
  }
  incidents_.push_back(std::move(incident));
}

}  // namespace brigade::elastic
