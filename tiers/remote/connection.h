// Connection: one connection to one Redis node, plain TCP or TLS, authenticated.
//
// hiredis 0.14 (Debian 12) has no TLS, so the socket, the TLS session (OpenSSL) and AUTH
// are done here, and hiredis is kept for what it is good at: formatting commands
// (redisFormatCommandArgv) and parsing replies (redisReader, whose reply functions the
// cluster client swaps to land large values straight in their destination).
//
// - Connect: TCP with a connect timeout (non-blocking connect + poll), TCP_NODELAY, then
//   SO_RCVTIMEO/SO_SNDTIMEO: every later read or write waits at most the command timeout.
// - TLS: the handshake (bounded by the connect timeout), the node's certificate verified
//   against TlsOptions::ca_file and its name against server_name or the host as addressed
//   (an IP address is matched as one), a client certificate when configured. Writes use
//   send(MSG_NOSIGNAL), also under TLS, so a closed peer never raises SIGPIPE.
// - AUTH: `AUTH user password` (or `AUTH password`) right after connecting, on every
//   connection, before any other command.
//
// Errors: IoError when the node cannot be reached or stops answering (refused, timed out,
// closed: a cache miss, try again later); Rejected when the node answered but the two
// sides do not trust each other (certificate not verified, TLS handshake refused, AUTH
// refused, NOAUTH): a configuration error, which ClusterClient::Open reports at start.
// After any error the connection is broken and must be dropped.
//
// Threading: a Connection is used by one thread at a time; a TlsContext is shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/status.h"
#include "tiers/remote/remote_options.h"

struct redisReader;
struct redisReply;
struct ssl_ctx_st;
struct ssl_st;
struct x509_st;
struct evp_pkey_st;

namespace kvtier::remote {

// The TLS context's client-certificate callback (connection.cc).
int NoteCertificateRequest(ssl_st* ssl, x509_st** cert, evp_pkey_st** key);

// Owns a hiredis reply.
struct ReplyDeleter {
  void operator()(redisReply* r) const;
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// A password file: one line (a trailing newline is dropped), 1 to kMaxPasswordBytes
// bytes, a regular file that others can neither read nor write (group access is the
// owner's choice, e.g. root:kvtier 0640). Invalid, naming the file, otherwise.
inline constexpr size_t kMaxPasswordBytes = 1024;
StatusOr<std::string> ReadPasswordFile(const std::string& path);
// The file behind fd is regular and closed to others (no o+rwx); Invalid naming `what`
// and `path` otherwise. Used for the password file and the TLS key file.
Status CheckPrivateFile(int fd, const std::string& path, const std::string& what);

// The TLS settings loaded once (CA bundle, client certificate and key) for every
// connection of a client.
class TlsContext {
 public:
  // Invalid, naming the file and OpenSSL's reason, when a file cannot be loaded or the key
  // does not match the certificate.
  static StatusOr<std::shared_ptr<TlsContext>> Create(const TlsOptions& opts);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  ssl_ctx_st* ctx() const { return ctx_; }
  const TlsOptions& options() const { return opts_; }

 private:
  TlsContext() = default;
  ssl_ctx_st* ctx_ = nullptr;
  TlsOptions opts_;
};

struct ConnectSettings {
  uint32_t connect_timeout_ms = 200;  // TCP connect, and the TLS handshake. Default: 200
  uint32_t command_timeout_ms = 500;  // every later socket read/write. Default: 500
  std::string user;                   // ACL user for AUTH; "" = AUTH password only. Default: ""
  std::string password;               // "" = no AUTH. Default: ""
  std::shared_ptr<TlsContext> tls;    // null = plain TCP. Default: null
};

class Connection {
 public:
  static StatusOr<std::unique_ptr<Connection>> Open(const std::string& host, uint16_t port,
                                                    const ConnectSettings& s);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Queues one command; nothing is sent until Flush().
  Status Append(std::span<const std::string_view> argv);
  // Writes every queued command.
  Status Flush();
  // Reads the next reply (Ok with *out set), reading the socket as needed.
  Status Read(Reply* out);
  // Append + Flush + Read.
  Status Command(std::span<const std::string_view> argv, Reply* out);

  // The reply parser: the cluster client sets its reply functions and privdata.
  redisReader* reader() { return reader_; }
  bool broken() const { return broken_; }
  const std::string& peer() const { return peer_; }  // "host:port"

 private:
  Connection() = default;
  Status Fail(Status s);
  Status Handshake(const std::string& host, const ConnectSettings& s);
  Status Auth(const ConnectSettings& s);
  Status WriteAll(const char* p, size_t n);
  // Reads some bytes into buf_; the count, or an error.
  StatusOr<size_t> ReadSome();

  int fd_ = -1;
  ssl_st* ssl_ = nullptr;
  redisReader* reader_ = nullptr;
  std::string peer_;
  std::vector<std::pair<char*, size_t>> pending_;  // formatted commands not yet written
  std::unique_ptr<char[]> buf_;
  bool broken_ = false;
  // The node asked for a client certificate during the handshake and none is configured:
  // TLS 1.3 reports the refusal only after the handshake, often as a plain close.
  bool cert_requested_ = false;
  friend int NoteCertificateRequest(ssl_st* ssl, x509_st** cert, evp_pkey_st** key);
};

}  // namespace kvtier::remote
