// `zaya launch [train options] [--np N] [supervision options]`: runs `zaya train` (under mpirun
// when --np > 1 or --hostfile is given) under the fault-tolerance supervisor, which restarts the
// job from its latest checkpoint when a rank crashes, a collective times out or the job hangs
// (src/supervise/supervisor.h). Heartbeats go to RUN_DIR/heartbeat/, events to
// RUN_DIR/supervisor.jsonl.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "commands.h"
#include "core/error.h"
#include "supervise/supervisor.h"
#include "train/recipe.h"
#include "train_options.h"

namespace zaya::cli {

namespace {

struct LaunchOptions {
  TrainCliOptions train;  // forwarded to `zaya train`
  // the job's processes
  int np = 1;
  std::string hostfile, mpirun = "mpirun";
  std::vector<std::string> mpirun_args;
  // the supervisor
  int max_restarts = 10, max_attempts_without_progress = 3;
  double heartbeat_timeout = 900, startup_timeout = 1800, checkpoint_timeout = 1800, restart_delay = 5,
         kill_grace = 10;
  bool preflight = false;
  double preflight_burn_in = 2;
};

bool inside_mpi_job() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_RANK") || std::getenv("PMIX_RANK");
}

// `mpirun [--hostfile F] -np N -x ZAYA_HEARTBEAT_DIR [args] zaya`, or just `zaya`.
std::vector<std::string> zaya_on_every_rank(const LaunchOptions& o) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) fail("launch", "cannot find the zaya binary (/proc/self/exe): " + ec.message());
  std::vector<std::string> cmd;
  if (o.np > 1 || !o.hostfile.empty()) {
    cmd = {o.mpirun};
    if (!o.hostfile.empty()) cmd.insert(cmd.end(), {"--hostfile", o.hostfile});
    // -x forwards the heartbeat directory to ranks on other nodes (local ones inherit it).
    cmd.insert(cmd.end(), {"-np", std::to_string(o.np), "-x", "ZAYA_HEARTBEAT_DIR"});
    cmd.insert(cmd.end(), o.mpirun_args.begin(), o.mpirun_args.end());
  }
  cmd.push_back(self);
  return cmd;
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::vector<std::string> preflight_command(const LaunchOptions& o) {
  std::vector<std::string> cmd = zaya_on_every_rank(o);
  cmd.insert(cmd.end(),
             {"doctor", "--backend", o.train.backend, "--burn-in", format_number(o.preflight_burn_in),
              "--comm-timeout",
              format_number(o.train.comm_timeout > 0 ? std::min(o.train.comm_timeout, 300.0) : 300)});
  return cmd;
}

std::vector<std::string> job_command(const LaunchOptions& o) {
  std::vector<std::string> cmd = zaya_on_every_rank(o);
  cmd.push_back("train");
  const std::vector<std::string> train = train_arguments(o.train);
  cmd.insert(cmd.end(), train.begin(), train.end());
  return cmd;
}

void run_launch(const LaunchOptions& o) {
  if (inside_mpi_job())
    fail("launch", "zaya launch is running inside an MPI job",
         "run it as a plain command: it starts mpirun itself (zaya launch --np N ...)");
  if (!o.mpirun_args.empty() && o.np <= 1 && o.hostfile.empty())
    fail("launch", "--mpirun-arg is given but the job does not run under mpirun",
         "add --np N (N > 1) or --hostfile");
  // The recipe is resolved here too, so that a bad key or value fails at once instead of in a
  // restart loop, and so that the run directory is known.
  const Recipe r = resolve_recipe(o.train.recipe_path, o.train.overrides);
  SupervisorOptions so;
  so.command = job_command(o);
  if (o.preflight) so.preflight_command = preflight_command(o);
  so.heartbeat_dir = r.run_dir + "/heartbeat";
  so.checkpoint_dir = checkpoint_dir(r);
  so.events_path = r.run_dir + "/supervisor.jsonl";
  so.expected_ranks = o.np;
  so.max_restarts = o.max_restarts;
  so.max_attempts_without_progress = o.max_attempts_without_progress;
  so.heartbeat_timeout_s = o.heartbeat_timeout;
  so.startup_timeout_s = o.startup_timeout;
  so.checkpoint_timeout_s = o.checkpoint_timeout;
  so.restart_delay_s = o.restart_delay;
  so.kill_grace_s = o.kill_grace;
  auto shown = [](const std::vector<std::string>& argv) {
    std::string s;
    for (const std::string& a : argv) s += (s.empty() ? "" : " ") + a;
    return s;
  };
  std::fprintf(stderr, "zaya launch: job: %s\n", shown(so.command).c_str());
  if (o.preflight)
    std::fprintf(stderr, "zaya launch: health check before every attempt: %s\n",
                 shown(so.preflight_command).c_str());
  std::fprintf(
      stderr,
      "zaya launch: run %s; heartbeat timeout %.0f s, startup timeout %.0f s, checkpoint timeout %.0f s, "
      "at most %d restarts\n",
      r.run_dir.c_str(), o.heartbeat_timeout, o.startup_timeout, o.checkpoint_timeout, o.max_restarts);
  if (r.checkpoint.every <= 0)
    std::fprintf(stderr,
                 "zaya launch: warning: checkpoint.every = 0, so a restart goes back to step 0 "
                 "(set checkpoint.every to bound the work a failure costs)\n");
  const SupervisorResult res = supervise(so);
  std::fflush(stdout);
  if (res.outcome == "gave_up")
    fail("launch",
         "the job did not finish after " + std::to_string(res.attempts) + " attempt" +
             (res.attempts == 1 ? "" : "s") + "; last failure: " + res.last_failure,
         "see " + so.events_path + " and the job's output above");
  if (res.exit_code != 0) {
    std::fflush(stderr);
    std::exit(res.exit_code);
  }
}

}  // namespace

void add_launch(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "launch",
      "Train under the fault-tolerance supervisor: restart from the latest checkpoint on failures and hangs");
  static LaunchOptions o;
  add_train_options(cmd, o.train);
  cmd->add_option("--np", o.np, "Ranks: more than 1 runs the job under mpirun")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--hostfile", o.hostfile, "mpirun hostfile (\"node01 slots=8\" per line); implies mpirun");
  cmd->add_option("--mpirun", o.mpirun, "The mpirun program")->capture_default_str();
  cmd->add_option("--mpirun-arg", o.mpirun_args,
                  "One more argument for mpirun (repeatable): --mpirun-arg=--oversubscribe");
  cmd->add_option("--max-restarts", o.max_restarts, "Restarts allowed in all")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-attempts-without-progress", o.max_attempts_without_progress,
                  "Give up after this many failed attempts in a row that committed no new checkpoint")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--heartbeat-timeout", o.heartbeat_timeout,
                  "Seconds a rank may go without a heartbeat (one per step, eval and checkpoint) before the "
                  "job counts as hung")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--startup-timeout", o.startup_timeout,
                  "Seconds allowed for starting (loading, resuming) and for the final export")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--checkpoint-timeout", o.checkpoint_timeout,
                  "Seconds a checkpoint may block a rank (the start of a save, which waits for the previous "
                  "one to reach the disk; the commit; a rollback's reload) before the job counts as hung")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--restart-delay", o.restart_delay, "Seconds to wait before a restart")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kill-grace", o.kill_grace, "Seconds between SIGTERM and SIGKILL when stopping a job")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag(
      "--preflight", o.preflight,
      "Before every attempt, run `zaya doctor` on every rank (GEMM check and burn-in, exact all-reduce); "
      "a failed check counts as a failed attempt");
  cmd->add_option("--preflight-burn-in", o.preflight_burn_in, "Seconds of GEMM burn-in in the health check")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->callback([] { run_launch(o); });
}

}  // namespace zaya::cli
