// The zaya CLI subcommands. Each file registers one subcommand on the app; the work itself
// lives in the library so the CLI stays a thin parse-and-call layer.
#pragma once
#include <CLI/CLI.hpp>

namespace zaya::cli {

void add_info(CLI::App& app);
void add_init(CLI::App& app);
void add_generate(CLI::App& app);
void add_chat(CLI::App& app);
void add_serve(CLI::App& app);
void add_score(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_ckpt(CLI::App& app);
void add_data(CLI::App& app);
void add_data_prepare(CLI::App* data);  // `data prepare` and `data stats` (cmd_data_prepare.cpp)
void add_tokenizer(CLI::App& app);
void add_train(CLI::App& app);
void add_launch(CLI::App& app);
void add_doctor(CLI::App& app);
void add_eval(CLI::App& app);
void add_export(CLI::App& app);

}  // namespace zaya::cli
