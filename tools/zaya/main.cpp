// zaya: one binary that trains, evaluates and serves ZAYA1-family MoE models.
#include <cstdio>

#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"zaya: train, evaluate and serve ZAYA1-family mixture-of-experts models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "zaya 0.1.0");
  zaya::cli::add_info(app);
  zaya::cli::add_init(app);
  zaya::cli::add_generate(app);
  zaya::cli::add_score(app);
  zaya::cli::add_tokenize(app);
  zaya::cli::add_data(app);
  zaya::cli::add_tokenizer(app);
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
