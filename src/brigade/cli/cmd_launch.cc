// brigade launch --nproc-per-node N [--nnodes [MIN:]MAX (--node-rank R | --standby)
//                --rdzv HOST:PORT] -- COMMAND ...
// Starts this node's workers; see launcher.h for what each worker is given.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "brigade/cli/commands.h"
#include "brigade/cli/launcher.h"
#include "brigade/core/error.h"

namespace brigade::cli {

namespace {

// "N" (N:N) or "MIN:MAX".
void parse_nnodes(const std::string& text, LaunchOptions* o) {
  const auto number = [&](const std::string& part) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || errno != 0 || n < -4096 || n > 4096) {
      throw_error("--nnodes wants N or MIN:MAX (for example 4 or 2:4), got '{}'", text);
    }
    return static_cast<int>(n);
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    o->nnodes = number(text);
    o->min_nnodes = 0;
    return;
  }
  o->min_nnodes = number(text.substr(0, colon));
  o->nnodes = number(text.substr(colon + 1));
  if (o->min_nnodes > o->nnodes) {
    throw_error(
        "--nnodes {}: MIN {} is more than MAX {}; the job starts with MAX nodes and may go on "
        "with no fewer than MIN: pass --nnodes {}:{}",
        text, o->min_nnodes, o->nnodes, o->nnodes, o->min_nnodes);
  }
  if (o->min_nnodes < 1) {
    throw_error(
        "--nnodes {}: MIN must be at least 1 (node 0, which leads, always stays): pass --nnodes "
        "1:{} to go on down to node 0 alone",
        text, o->nnodes);
  }
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto options = std::make_shared<LaunchOptions>();
  auto rdzv_timeout_s = std::make_shared<int64_t>(options->rdzv_timeout_ms / 1000);
  auto grace_period_s = std::make_shared<double>(options->failure_grace_ms / 1000.0);
  auto step_timeout_s = std::make_shared<double>(options->step_timeout_ms / 1000.0);
  auto inject = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Run a command as N cooperating workers per node, torchrun-style: `brigade launch "
      "--nproc-per-node 4 -- train config.toml`. A brigade verb runs with this binary; "
      "anything else is looked up on PATH");
  cmd->add_option("--nproc-per-node", options->nproc_per_node,
                  "Workers on this node (under srun leave it out: each task is one worker)")
      ->check(CLI::Range(1, 4096));
  auto nnodes = std::make_shared<std::string>("1");
  cmd->add_option("--nnodes", *nnodes,
                  "Nodes in the job: N, or MIN:MAX as torchrun. The job starts with MAX nodes "
                  "(it waits for all of them); with MIN:MAX, when nodes are lost and no standby "
                  "is free, it goes on with the live nodes while at least MIN are left "
                  "(renumbered 0.., node 0 leading; a brigade train keeps its global batch: dp "
                  "shrinks with the nodes and train.grad_accum grows as much; needs "
                  "--max-restarts)")
      ->capture_default_str();
  CLI::Option* node_rank =
      cmd->add_option("--node-rank", options->node_rank, "This node's rank, 0..nnodes-1")
          ->capture_default_str();
  cmd->add_flag("--standby", options->standby,
                "Start a standby node for a job of --nnodes nodes (standbys not counted; no "
                "--node-rank): it joins the rendezvous, runs no workers and waits; when a node "
                "other than node 0 is lost (its launcher killed, hung or cut off the network "
                "for 2 s), the coordinator gives that node's rank to a free standby, which runs "
                "its workers from the newest checkpoint at the same world size (needs "
                "--max-restarts, which the restart counts against). Start as many as you want "
                "spare nodes. A standby started while the job runs on fewer nodes (--nnodes "
                "MIN:MAX) joins it: once it has beaten for 2 s the job stops at a step boundary "
                "(an interrupt checkpoint) and grows back with it at the next generation, using "
                "no restart")
      ->excludes(node_rank);
  cmd->add_option("--node-id", options->node_id,
                  "This machine's identity (default: env BRIGADE_NODE_ID, else the host name): "
                  "a machine declared lost twice is quarantined and its joiners refused. Give "
                  "each node its own where several share a host name (one machine, containers)")
      ->envname("BRIGADE_NODE_ID");
  cmd->add_option("--rdzv", options->rdzv,
                  "HOST:PORT where node 0's launcher hosts the rendezvous store (needed with "
                  "--nnodes > 1; one node defaults to 127.0.0.1 and a free port)");
  cmd->add_option("--rdzv-token", options->rdzv_token,
                  "The job's secret, the same on every node (default: env BRIGADE_RDZV_TOKEN; "
                  "one node generates its own). The environment keeps it out of `ps`");
  cmd->add_option("--rdzv-backend", options->rdzv_backend,
                  "Where the coordinator keeps the job's state: tcp (node 0's store) or etcd "
                  "(--rdzv-endpoints; the token is the password of the job's etcd user)")
      ->capture_default_str();
  cmd->add_option("--rdzv-endpoints", options->rdzv_endpoints,
                  "etcd's client URLs, comma-separated (http://etcd0:2379,http://etcd1:2379)");
  cmd->add_option("--iface", options->iface,
                  "Network interface the workers listen on for other nodes, e.g. eth1 (sets "
                  "GLOO_SOCKET_IFNAME; default: the one that reaches the --rdzv host)");
  cmd->add_option("--rdzv-timeout-s", *rdzv_timeout_s, "How long launchers wait for each other")
      ->capture_default_str();
  cmd->add_option("--grace-period-s", *grace_period_s,
                  "After a worker fails, how long the others get to exit on SIGTERM before "
                  "SIGKILL")
      ->check(CLI::Range(0.0, 86'400.0))
      ->capture_default_str();
  cmd->add_option("--max-restarts", options->max_restarts,
                  "After a worker crashes or hangs, start the workers again up to this many "
                  "times (a brigade train resumes from its newest checkpoint); across nodes, "
                  "the same on every node: all nodes restart together")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  cmd->add_option("--step-timeout-s", *step_timeout_s,
                  "A worker that sends heartbeats but completes no training step for this long "
                  "counts as hung (a brigade train worker; a silent one after 2 s)")
      ->check(CLI::Range(1.0, 7.0 * 86'400.0))
      ->capture_default_str();
  cmd->add_option("--metrics", options->metrics_address,
                  "Where to serve /metrics for Prometheus: HOST:PORT (port 0 picks a free one and "
                  "prints it), off, or auto (127.0.0.1:0 for a brigade train, else off). It has "
                  "no authentication: keep it on loopback unless the network is trusted")
      ->capture_default_str();
  cmd->add_option("--inject", *inject,
                  "Faults for tests and demos, separated by commas: "
                  "chaos:mtbf=SECONDS[:kinds=kill+stop][:seed=N] (SIGKILL or SIGSTOP to a random "
                  "worker at exponentially distributed intervals; restarts need --max-restarts); "
                  "kill-agent:node=N:step=S[:gen=G] (node N's launcher kills its workers and "
                  "itself once they completed step S); partition:node=N:step=S[:gen=G] (node N's "
                  "launcher takes its network interface down then: root, and no loopback); "
                  "hold:node=N:step=S[:gen=G] (node N's workers wait after step S until the "
                  "generation stops, for tests). A fault strikes generation G only (0 by "
                  "default)");
  cmd->add_option("command", options->command,
                  "The command and its arguments, after --: a brigade verb or a program")
      ->required();
  // Without --, CLI11 would take the command's own options for launch's;
  // catch that here to say how to fix it.
  cmd->allow_extras();
  cmd->callback([cmd, options, nnodes, rdzv_timeout_s, grace_period_s, step_timeout_s, inject] {
    // CLI11 leaves the "--" separator itself among the extras.
    std::string extras;
    for (const std::string& arg : cmd->remaining()) {
      if (arg != "--") extras += (extras.empty() ? "" : " ") + arg;
    }
    if (!extras.empty()) {
      throw_error(
          "launch does not know {}: launch's options go first, then --, then the command and its "
          "arguments (brigade launch --nproc-per-node 2 -- sh -c 'echo $RANK')",
          extras);
    }
    parse_nnodes(*nnodes, options.get());
    options->rdzv_timeout_ms = *rdzv_timeout_s * 1000;
    options->failure_grace_ms = static_cast<int64_t>(*grace_period_s * 1000);
    options->step_timeout_ms = static_cast<int64_t>(*step_timeout_s * 1000);
    options->node_faults = elastic::parse_node_faults(*inject);
    options->chaos = elastic::parse_chaos(*inject);
    const int status = run_launch(*options);
    if (status != 0) {
      throw ExitStatus{status};
    }
  });
}

}  // namespace brigade::cli
