// The supervision loop: start the job in its own process group, watch its exit status and its
// ranks' heartbeats, kill it when it hangs, and restart it under the policy in supervisor.h.
#include "supervise/supervisor.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "dist/comm.h"
#include "supervise/heartbeat.h"
#include "supervise/process_state.h"

extern char** environ;

namespace zaya {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// SIGINT/SIGTERM/SIGHUP set this while supervise() runs; the loop then stops the job.
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// Installs the stop handlers for the lifetime of one supervise() call and restores the previous ones.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &sa, &previous_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> previous_{};
};

// Sleeps up to `seconds`, returning early when a stop signal arrives.
void interruptible_sleep(double seconds) {
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (!g_stop_signal && Clock::now() < until) {
    const double left = seconds_between(Clock::now(), until);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.05)));
  }
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

std::string own_host() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

std::string exe_of(int64_t pid) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  return ec ? std::string() : p.string();
}

class Events {
 public:
  Events(const SupervisorOptions& o) : path_(o.events_path), log_(o.log) {
    if (!log_)
      log_ = [](const std::string& line) { std::fprintf(stderr, "zaya launch: %s\n", line.c_str()); };
  }
  // Prints `line` and appends {"time", "event", ...fields} to the events file.
  void emit(const std::string& event, const std::string& line,
            nlohmann::json fields = nlohmann::json::object()) {
    log_(line);
    if (path_.empty()) return;
    fields["event"] = event;
    fields["message"] = line;
    fields["time"] =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::error_code ec;
    const auto parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream out(path_, std::ios::app);
    out << fields.dump() << '\n';
    if (!out && !warned_) {
      warned_ = true;
      log_("warning: cannot append to " + path_);
    }
  }

 private:
  std::string path_;
  std::function<void(const std::string&)> log_;
  bool warned_ = false;
};

// The job: one child process, leader of its own process group (mpirun and its ranks, or one rank).
class Job {
 public:
  Job(const SupervisorOptions& o, std::vector<std::string> command) : o_(o), command_(std::move(command)) {}

  void start() {
    std::vector<std::string> env_strings;
    const std::string key = std::string(kHeartbeatDirEnv) + "=";
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, key.c_str(), key.size()) != 0) env_strings.emplace_back(*e);
    env_strings.push_back(key + o_.heartbeat_dir);
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    for (auto& s : command_) argv.push_back(s.data());
    argv.push_back(nullptr);

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t defaults, empty;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGHUP);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    sigemptyset(&empty);
    posix_spawnattr_setsigmask(&attr, &empty);
    pid_t pid = 0;
    const int rc = posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    if (rc != 0)
      fail("launch", "cannot start " + command_[0] + ": " + std::strerror(rc),
           "check that the program exists and is executable (mpirun: is OpenMPI installed?)");
    pid_ = pid;
    started_ = Clock::now();
  }

  // The wait status once the job has exited (reaping it), or -1 while it runs.
  int poll_exit() {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    return -1;
  }

  // Stops the whole process group: SIGTERM, then SIGKILL after the grace period. Also kills
  // ranks on this host that the heartbeats name and that outlived their group (same binary only).
  void stop(const std::vector<HeartbeatRecord>& ranks) {
    if (!reaped_) {
      int status = 0;
      killpg(pid_, SIGTERM);
      killpg(pid_, SIGCONT);  // stopped processes must run to act on SIGTERM
      const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(o_.kill_grace_s));
      while (Clock::now() < until) {
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          reaped_ = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!reaped_) {
        killpg(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        reaped_ = true;
      }
    }
    sweep(ranks);
  }

  // After the job ended: nothing of its process group, nor any of its local ranks, may linger
  // (a stopped or hung rank would hold its GPU and its files).
  void sweep(const std::vector<HeartbeatRecord>& ranks) {
    killpg(pid_, SIGKILL);
    const std::string host = own_host(), self = exe_of(getpid());
    for (const HeartbeatRecord& r : ranks) {
      if (r.host != host || r.pid <= 0 || r.pid == getpid()) continue;
      if (!self.empty() && exe_of(r.pid) == self) kill(pid_t(r.pid), SIGKILL);
    }
  }

  double age() const { return seconds_between(started_, Clock::now()); }
  Clock::time_point started() const { return started_; }

 private:
  const SupervisorOptions& o_;
  std::vector<std::string> command_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  Clock::time_point started_;
};

// Tracks when each rank's heartbeat last changed, on the supervisor's clock.
class HangDetector {
 public:
  explicit HangDetector(const SupervisorOptions& o) : o_(o) {}

  // A description of the hang ("" while every rank is live).
  std::string check(Clock::time_point job_started) {
    const auto now = Clock::now();
    records_ = read_heartbeats(o_.heartbeat_dir);
    int world = o_.expected_ranks;
    for (const HeartbeatRecord& r : records_) {
      world = std::max(world, r.world);
      auto it = seen_.find(r.rank);
      if (it == seen_.end() || changed(it->second.record, r)) seen_[r.rank] = {r, now};
    }
    for (int rank = 0; rank < world; ++rank) {
      auto it = seen_.find(rank);
      if (it == seen_.end()) {
        const double waited = seconds_between(job_started, now);
        if (waited > o_.startup_timeout_s)
          return "rank " + std::to_string(rank) + " sent no heartbeat within " + format_seconds(waited) +
                 " s of the start (--startup-timeout " + format_seconds(o_.startup_timeout_s) + ")";
        continue;
      }
      const HeartbeatRecord& r = it->second.record;
      if (r.phase == "done") continue;
      const PhaseLimit limit_of_phase = phase_limit(r.phase);
      const double limit = limit_of_phase.seconds;
      const double quiet = seconds_between(it->second.when, now);
      // A rank that has begun to exit (killed while a thread finishes an fsync, say) is not hung:
      // it gets one more heartbeat timeout to end, so that its exit status reports what happened.
      if (quiet > limit && quiet <= limit + o_.heartbeat_timeout_s && r.host == own_host() &&
          process_is_exiting(r.pid))
        continue;
      if (quiet > limit)
        return "rank " + std::to_string(rank) + " (pid " + std::to_string(r.pid) + " on " + r.host +
               ") has not beaten for " + format_seconds(quiet) + " s (last beat: \"" + r.phase +
               "\" at step " + std::to_string(r.step) + "; " + limit_of_phase.option + " " +
               format_seconds(limit) + ")";
    }
    return "";
  }

  const std::vector<HeartbeatRecord>& records() const { return records_; }

  int64_t last_step() const {
    int64_t s = -1;
    for (const auto& [rank, seen] : seen_) s = std::max(s, seen.record.step);
    return s;
  }

 private:
  // How long a rank may stay quiet in a phase, and the option that sets it.
  struct PhaseLimit {
    double seconds;
    std::string option;
  };
  PhaseLimit phase_limit(const std::string& phase) const {
    if (phase == "start" || phase == "final") return {o_.startup_timeout_s, "--startup-timeout"};
    if (phase == "checkpoint") return {o_.checkpoint_timeout_s, "--checkpoint-timeout"};
    return {o_.heartbeat_timeout_s, "--heartbeat-timeout"};
  }
  static bool changed(const HeartbeatRecord& a, const HeartbeatRecord& b) {
    return a.pid != b.pid || a.phase != b.phase || a.step != b.step || a.time != b.time;
  }
  struct Seen {
    HeartbeatRecord record;
    Clock::time_point when;
  };
  const SupervisorOptions& o_;
  std::map<int, Seen> seen_;
  std::vector<HeartbeatRecord> records_;
};

}  // namespace

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    if (code == 0) return "exited normally";
    std::string s = "exited with status " + std::to_string(code);
    if (code == kCommTimeoutExitCode) s += ": a collective timed out (comm watchdog)";
    if (code == kCommMismatchExitCode) s += ": ranks issued different collectives (comm watchdog)";
    // mpirun and shells report a process killed by signal N as status 128 + N.
    if (code > 128 && code < 128 + 65) {
      const char* name = strsignal(code - 128);
      s += " (a process was killed by signal " + std::to_string(code - 128) + ", " +
           (name ? name : "unknown") + ")";
    }
    return s;
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "unknown") + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int64_t latest_checkpoint_step(const std::string& root) {
  const auto all = list_checkpoints(root);
  return all.empty() ? -1 : all.front().step;
}

namespace {

// Runs the preflight health check to its end: "" when it passed, else what went wrong.
std::string run_preflight(const SupervisorOptions& o) {
  Job check(o, o.preflight_command);
  check.start();
  while (true) {
    const int status = check.poll_exit();
    if (status != -1) {
      check.sweep({});
      return WIFEXITED(status) && WEXITSTATUS(status) == 0
                 ? ""
                 : "the health check " + describe_wait_status(status);
    }
    if (g_stop_signal) {
      check.stop({});
      return "stopped";
    }
    if (check.age() > o.preflight_timeout_s) {
      check.stop({});
      return "the health check did not finish within " + format_seconds(o.preflight_timeout_s) + " s";
    }
    interruptible_sleep(o.poll_interval_s);
  }
}

}  // namespace

SupervisorResult supervise(const SupervisorOptions& o) {
  if (o.command.empty()) fail("launch", "no job command to supervise");
  if (o.heartbeat_dir.empty()) fail("launch", "no heartbeat directory");
  StopSignals signals;
  Events events(o);
  SupervisorResult result;
  int64_t checkpoint = latest_checkpoint_step(o.checkpoint_dir);
  int attempts_without_progress = 0;
  auto stopped = [&](const std::string& when) {
    const int sig = g_stop_signal;
    result.outcome = "stopped";
    result.exit_code = 128 + sig;
    events.emit("stopped", "stopped by signal " + std::to_string(sig) + " " + when + "; not restarting",
                {{"attempt", result.attempts}, {"signal", sig}});
  };
  while (true) {
    ++result.attempts;
    const std::string attempt = "attempt " + std::to_string(result.attempts);
    std::string failure;
    int status = -1;
    if (!o.preflight_command.empty()) {
      events.emit("preflight", attempt + ": running the health check", {{"attempt", result.attempts}});
      const std::string problem = run_preflight(o);
      if (g_stop_signal) {
        stopped("during the health check");
        break;
      }
      if (!problem.empty()) {
        failure = "preflight: " + problem;
        events.emit("preflight_failed", attempt + " failed before the job started: " + problem,
                    {{"attempt", result.attempts}, {"detail", problem}});
      }
    }
    if (failure.empty()) {
      reset_heartbeat_dir(o.heartbeat_dir);
      Job job(o, o.command);
      job.start();
      events.emit(
          "start",
          attempt + ": started the job" +
              (checkpoint >= 0 ? ", resuming from the checkpoint of step " + std::to_string(checkpoint)
                               : ", from scratch (no checkpoint yet)"),
          {{"attempt", result.attempts}, {"resume_step", checkpoint}});
      HangDetector hangs(o);
      while (true) {
        status = job.poll_exit();
        if (status != -1 || g_stop_signal) break;
        failure = hangs.check(job.started());
        if (!failure.empty()) break;
        interruptible_sleep(o.poll_interval_s);
      }
      if (g_stop_signal && status == -1) {
        events.emit("stopping", std::string("received ") + strsignal(g_stop_signal) + "; stopping the job",
                    {{"attempt", result.attempts}, {"signal", int(g_stop_signal)}});
        job.stop(hangs.records());
        stopped("while the job ran");
        break;
      }
      if (!failure.empty()) {
        events.emit("hang", attempt + " hangs: " + failure + "; killing the job",
                    {{"attempt", result.attempts}, {"detail", failure}, {"last_step", hangs.last_step()}});
        job.stop(hangs.records());
        failure = "hang: " + failure;
      } else {
        job.sweep(hangs.records());
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          result.outcome = "finished";
          events.emit("finished",
                      attempt + ": the job finished after " + std::to_string(result.restarts) + " restart" +
                          (result.restarts == 1 ? "" : "s"),
                      {{"attempt", result.attempts}, {"restarts", result.restarts}});
          break;
        }
        failure = describe_wait_status(status);
        events.emit("failure", attempt + " failed: the job " + failure,
                    {{"attempt", result.attempts},
                     {"detail", failure},
                     {"last_step", hangs.last_step()},
                     {"status", WIFEXITED(status) ? WEXITSTATUS(status) : -1},
                     {"signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0}});
      }
    }
    result.last_failure = failure;
    const int64_t now_checkpoint = latest_checkpoint_step(o.checkpoint_dir);
    const bool progress = now_checkpoint > checkpoint;
    checkpoint = now_checkpoint;
    attempts_without_progress = progress ? 0 : attempts_without_progress + 1;
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == kCommMismatchExitCode) {
      // Ranks that disagree on the sequence of collectives run different code paths: a bug that
      // a restart would only repeat.
      result.outcome = "gave_up";
      result.exit_code = 1;
      events.emit("gave_up",
                  "giving up: " + failure + " is a bug in the job, not a fault; a restart would repeat it",
                  {{"attempt", result.attempts}, {"detail", failure}});
      break;
    }
    if (attempts_without_progress >= o.max_attempts_without_progress) {
      result.outcome = "gave_up";
      result.exit_code = 1;
      events.emit(
          "gave_up",
          "giving up: " + std::to_string(attempts_without_progress) + " attempt" +
              (attempts_without_progress == 1 ? "" : "s") +
              " in a row failed without committing a new checkpoint (--max-attempts-without-progress " +
              std::to_string(o.max_attempts_without_progress) + "); last failure: " + failure,
          {{"attempt", result.attempts}, {"detail", failure}});
      break;
    }
    if (result.restarts >= o.max_restarts) {
      result.outcome = "gave_up";
      result.exit_code = 1;
      events.emit("gave_up",
                  "giving up: the job failed after " + std::to_string(result.restarts) +
                      " restarts (--max-restarts " + std::to_string(o.max_restarts) +
                      "); last failure: " + failure,
                  {{"attempt", result.attempts}, {"detail", failure}});
      break;
    }
    ++result.restarts;
    events.emit("restart",
                "restarting in " + format_seconds(o.restart_delay_s) + " s (restart " +
                    std::to_string(result.restarts) + " of at most " + std::to_string(o.max_restarts) + ")",
                {{"attempt", result.attempts}, {"restarts", result.restarts}, {"resume_step", checkpoint}});
    interruptible_sleep(o.restart_delay_s);
    if (g_stop_signal) {
      stopped("before restarting");
      break;
    }
  }
  return result;
}

}  // namespace zaya
