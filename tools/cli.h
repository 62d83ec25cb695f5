// Small command-line framework shared by kvtierctl and kvtier-bench.
//
// Each subcommand lives in its own file and registers itself with a static
// CommandRegistrar (the files are linked into the executable directly, so the
// registration is never dropped by the linker). Arguments are parsed by Args: long
// options "--name value" or "--name=value", flags "--name", and positionals.
// Every error is one line on stderr and a non-zero exit; no command leaves a partial
// output file behind (write to FILE.tmp, then rename).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/size.h"
#include "formats/status.h"

namespace kvtier::cli {

class Args {
 public:
  // `flags` lists option names that take no value (e.g. {"json"}).
  static StatusOr<Args> Parse(const std::vector<std::string>& argv,
                              const std::vector<std::string>& flags = {});
  bool Has(const std::string& name) const { return opts_.count(name) != 0; }
  std::optional<std::string> Get(const std::string& name) const;
  // Required option; Invalid "missing --name" when absent.
  StatusOr<std::string> Require(const std::string& name) const;
  StatusOr<double> GetDouble(const std::string& name, std::optional<double> def) const;
  StatusOr<int64_t> GetInt(const std::string& name, std::optional<int64_t> def) const;
  const std::vector<std::string>& positional() const { return pos_; }
  // Invalid naming the first option not in `known` (flags included).
  Status CheckKnown(const std::vector<std::string>& known) const;

 private:
  std::map<std::string, std::string> opts_;
  std::vector<std::string> pos_;
};

// A command gets the arguments after its name and returns the process exit code.
using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Command {
  std::string name;     // "codec", "keys", "bench" ...
  std::string summary;  // one line for `--help`
  CommandFn fn;
  // The command's options, printed by Main for `COMMAND --help` (or -h) anywhere in its
  // arguments. Empty: Main runs the command with the one argument "--help" instead, and the
  // command prints its own usage and returns 0 (every kvtierctl command does).
  std::string usage;
  // Names of the command's subcommands ("bench replay", "config check"), listed by the
  // top-level --help. `COMMAND SUB ... --help` prints the command's usage, which covers them.
  std::vector<std::string> subcommands;
};

std::map<std::string, Command>& Registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string summary, CommandFn fn, std::string usage = "",
                   std::vector<std::string> subcommands = {});
};

// Runs argv[1] as a command from the registry; prints usage for --help / no command.
// Leading global options: --socket PATH (the daemon's control socket). `--help` or `-h`
// anywhere after the command name prints that command's usage and exits 0 without running
// it (nor reaching a daemon).
int Main(const char* program, int argc, char** argv);

// The daemon socket: --socket given before the command, else $KVTIER_SOCKET, else the
// default config's "./kvtier-data/kvtierd.sock".
std::string SocketPath();

// Prints "program: message" to stderr and returns 2 (bad usage) or 1 (failure).
int Fail(const std::string& message, int code = 1);

// Whole-file helpers. WriteFileAtomic writes a fresh temp file beside path
// (CreateTempBeside) and renames it into place.
StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path);
Status WriteFileAtomic(const std::string& path, const void* data, size_t n);

// Creates "path.tmp.XXXXXX" beside path with mkostemp (O_EXCL: never an existing file, never
// through a link someone planted there; the rename then stays in one folder), with mode
// `mode` less the process's umask (as open(2) would make it: 0666 gives 0644 under the
// usual umask 022 and 0600 under 077). On success *tmp names it and *fd is open for
// writing (close-on-exec). Until ForgetTemp(*tmp), a SIGINT, SIGTERM or SIGHUP removes it
// before the process ends (the handler is installed here where none is set).
Status CreateTempBeside(const std::string& path, std::string* tmp, int* fd, mode_t mode = 0666);
// The temp file is renamed into place or removed: a signal no longer removes it.
void ForgetTemp(const std::string& tmp);
// The process's umask, read without changing it.
mode_t CurrentUmask();

// Sizes ("64MiB", "4G", "1.5GiB", "4096") use the one grammar of formats/size.h.
using ::kvtier::ParseSize;

}  // namespace kvtier::cli
