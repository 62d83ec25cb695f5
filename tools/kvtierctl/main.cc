// kvtierctl: the operator's command-line tool. Subcommands live in cmd_*.cc beside
// this file and register themselves (tools/cli.h).
#include "tools/cli.h"

int main(int argc, char** argv) { return kvtier::cli::Main("kvtierctl", argc, argv); }
