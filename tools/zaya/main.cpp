// zaya: one binary that trains, evaluates and serves ZAYA1-family MoE models.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "core/error.h"

// OpenMP threads that spin while waiting steal cores from each other (and from anything else
// running) on small shared machines; measured here, training ran 5x slower under load with
// spinning threads. libgomp reads its settings before main, so zaya re-executes itself once
// with passive waiting unless the user chose a policy.
static void prefer_passive_openmp_waiting(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("ZAYA_NO_REEXEC")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  setenv("ZAYA_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // only returns on failure: carry on as we are
}

int main(int argc, char** argv) {
  prefer_passive_openmp_waiting(argv);
  CLI::App app{"zaya: train, evaluate and serve ZAYA1-family mixture-of-experts models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "zaya 0.1.0");
  zaya::cli::add_info(app);
  zaya::cli::add_init(app);
  zaya::cli::add_generate(app);
  zaya::cli::add_chat(app);
  zaya::cli::add_serve(app);
  zaya::cli::add_score(app);
  zaya::cli::add_tokenize(app);
  zaya::cli::add_ckpt(app);
  zaya::cli::add_data(app);
  zaya::cli::add_tokenizer(app);
  zaya::cli::add_train(app);
  zaya::cli::add_launch(app);
  zaya::cli::add_doctor(app);
  zaya::cli::add_eval(app);
  zaya::cli::add_export(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const zaya::Error& e) {
    std::fprintf(stderr, "zaya: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zaya: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
