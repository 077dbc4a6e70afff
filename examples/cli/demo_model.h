// The built-in demo model: the "tiny" synthetic qwen3moe preset, written once to the
// temporary directory so `moeinfer-cli` runs with no arguments on a fresh machine.
#pragma once
#include <string>

std::string demo_model_path();
