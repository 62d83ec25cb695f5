// Connection implementation. See connection.h for the behaviour.
#include "tiers/remote/connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvtier::remote {

namespace {

constexpr size_t kReadBuf = 64 << 10;    // bytes per socket read
constexpr size_t kCoalesce = 16 << 10;   // commands up to this size share one write

std::string Errno(int e) { return std::strerror(e); }

// The oldest OpenSSL error of this thread, as text ("" when none), and the queue cleared.
std::string SslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  // "error:0A000086:SSL routines::certificate verify failed": keep the reason.
  std::string s(buf);
  const size_t p = s.rfind(':');
  return p == std::string::npos ? s : s.substr(p + 1);
}

bool IsIpAddress(const std::string& h) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, h.c_str(), &a4) == 1 || inet_pton(AF_INET6, h.c_str(), &a6) == 1;
}

void SetTimeouts(int fd, uint32_t ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// A socket BIO whose writes use send(MSG_NOSIGNAL): OpenSSL's own uses write(), which
// raises SIGPIPE on a connection the node closed.
int NoSigpipeWrite(BIO* b, const char* buf, int n) {
  int fd = -1;
  BIO_get_fd(b, &fd);
  BIO_clear_retry_flags(b);
  ssize_t r;
  do {
    r = ::send(fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_write(b);
  return static_cast<int>(r);
}
BIO_METHOD* SocketMethod() {
  static BIO_METHOD* m = [] {
    const BIO_METHOD* base = BIO_s_socket();
    BIO_METHOD* x = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "kvtier socket");
    BIO_meth_set_write(x, NoSigpipeWrite);
    BIO_meth_set_read(x, BIO_meth_get_read(base));
    BIO_meth_set_puts(x, BIO_meth_get_puts(base));
    BIO_meth_set_gets(x, BIO_meth_get_gets(base));
    BIO_meth_set_ctrl(x, BIO_meth_get_ctrl(base));
    BIO_meth_set_create(x, BIO_meth_get_create(base));
    BIO_meth_set_destroy(x, BIO_meth_get_destroy(base));
    BIO_meth_set_callback_ctrl(x, BIO_meth_get_callback_ctrl(base));
    return x;
  }();
  return m;
}

// TCP connect bounded by timeout_ms per address; the blocking socket, or IoError.
StatusOr<int> ConnectTcp(const std::string& host, uint16_t port, uint32_t timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int g = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (g != 0) return Status::IoError("cannot resolve " + host + ": " + gai_strerror(g));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    const int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (s < 0) {
      why = Errno(errno);
      continue;
    }
    int err = 0;
    if (::connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{s, POLLOUT, 0};
        int pr;
        do {
          pr = ::poll(&p, 1, static_cast<int>(timeout_ms));
        } while (pr < 0 && errno == EINTR);
        if (pr == 0) {
          err = ETIMEDOUT;
        } else if (pr < 0) {
          err = errno;
        } else {
          socklen_t l = sizeof err;
          if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
        }
      }
    }
    if (err != 0) {
      why = err == ETIMEDOUT ? "connect timed out" : Errno(err);
      ::close(s);
      continue;
    }
    const int flags = fcntl(s, F_GETFL);
    (void)fcntl(s, F_SETFL, flags & ~O_NONBLOCK);
    const int one = 1;
    (void)setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fd = s;
  }
  freeaddrinfo(res);
  if (fd < 0) return Status::IoError(why);
  return fd;
}

}  // namespace

void ReplyDeleter::operator()(redisReply* r) const {
  if (r) freeReplyObject(r);
}

Status CheckPrivateFile(int fd, const std::string& path, const std::string& what) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::Invalid(what + " " + path + ": " + Errno(errno));
  if (!S_ISREG(st.st_mode)) return Status::Invalid(what + " " + path + ": not a regular file");
  if ((st.st_mode & 0007) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::Invalid(what + " " + path + " is open to others (mode " + mode + "): chmod o-rwx it");
  }
  return Status::Ok();
}

StatusOr<std::string> ReadPasswordFile(const std::string& path) {
  const std::string what = "password file";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Invalid(what + " " + path + ": " + Errno(errno));
  Status s = CheckPrivateFile(fd, path, what);
  std::string text;
  if (s.ok()) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        s = Status::Invalid(what + " " + path + ": " + Errno(errno));
        break;
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > kMaxPasswordBytes + 2) {
        s = Status::Invalid(what + " " + path + ": longer than " + std::to_string(kMaxPasswordBytes) + " bytes");
        break;
      }
    }
  }
  ::close(fd);
  if (!s.ok()) return s;
  const size_t nl = text.find('\n');
  if (nl != std::string::npos) {
    if (text.find_first_not_of("\r\n", nl) != std::string::npos) {
      return Status::Invalid(what + " " + path + ": more than one line");
    }
    text.resize(nl);
  }
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) return Status::Invalid(what + " " + path + ": empty");
  if (text.size() > kMaxPasswordBytes) {
    return Status::Invalid(what + " " + path + ": longer than " + std::to_string(kMaxPasswordBytes) + " bytes");
  }
  return text;
}

StatusOr<std::shared_ptr<TlsContext>> TlsContext::Create(const TlsOptions& opts) {
  std::shared_ptr<TlsContext> t(new TlsContext());
  t->opts_ = opts;
  ERR_clear_error();
  t->ctx_ = SSL_CTX_new(TLS_client_method());
  if (!t->ctx_) return Status::Invalid("TLS: " + SslError());
  SSL_CTX_set_min_proto_version(t->ctx_, TLS1_2_VERSION);
  SSL_CTX_set_mode(t->ctx_, SSL_MODE_AUTO_RETRY);
  if (opts.verify) {
    SSL_CTX_set_verify(t->ctx_, SSL_VERIFY_PEER, nullptr);
    if (!opts.ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(t->ctx_, opts.ca_file.c_str(), nullptr) != 1) {
        return Status::Invalid("TLS CA file " + opts.ca_file + ": " + SslError());
      }
    } else if (SSL_CTX_set_default_verify_paths(t->ctx_) != 1) {
      return Status::Invalid("TLS: the system's trust store: " + SslError());
    }
  } else {
    SSL_CTX_set_verify(t->ctx_, SSL_VERIFY_NONE, nullptr);
  }
  if (opts.cert_file.empty() != opts.key_file.empty()) {
    return Status::Invalid("TLS: a client certificate needs both its certificate and its key file");
  }
  if (opts.cert_file.empty()) SSL_CTX_set_client_cert_cb(t->ctx_, NoteCertificateRequest);
  if (!opts.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(t->ctx_, opts.cert_file.c_str()) != 1) {
      return Status::Invalid("TLS certificate file " + opts.cert_file + ": " + SslError());
    }
    const int kfd = ::open(opts.key_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (kfd < 0) return Status::Invalid("TLS key file " + opts.key_file + ": " + Errno(errno));
    Status ks = CheckPrivateFile(kfd, opts.key_file, "TLS key file");
    ::close(kfd);
    KVTIER_RETURN_IF_ERROR(ks);
    if (SSL_CTX_use_PrivateKey_file(t->ctx_, opts.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return Status::Invalid("TLS key file " + opts.key_file + ": " + SslError());
    }
    if (SSL_CTX_check_private_key(t->ctx_) != 1) {
      return Status::Invalid("TLS key file " + opts.key_file + " does not match " + opts.cert_file + ": " +
                             SslError());
    }
  }
  return t;
}

TlsContext::~TlsContext() {
  if (ctx_) SSL_CTX_free(ctx_);
}

Connection::~Connection() {
  for (auto& [p, n] : pending_) redisFreeCommand(p);
  if (ssl_) SSL_free(ssl_);  // frees its BIO; the BIO does not close the socket
  if (fd_ >= 0) ::close(fd_);
  if (reader_) redisReaderFree(reader_);
}

Status Connection::Fail(Status s) {
  broken_ = true;
  if (cert_requested_ && s.code() != StatusCode::kRejected) {
    return Status::Rejected("TLS: " + peer_ + " asks for a client certificate and none is configured (see " +
                            "tls_cert_file and tls_key_file): " + s.message());
  }
  return s;
}

// OpenSSL calls this when the node asks for a client certificate and the context has none.
int NoteCertificateRequest(SSL* ssl, X509** /*cert*/, EVP_PKEY** /*key*/) {
  if (auto* c = static_cast<Connection*>(SSL_get_app_data(ssl))) c->cert_requested_ = true;
  return 0;  // no certificate: the handshake goes on without one
}

StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& host, uint16_t port,
                                                       const ConnectSettings& s) {
  std::unique_ptr<Connection> c(new Connection());
  c->peer_ = host + ":" + std::to_string(port);
  auto fd = ConnectTcp(host, port, s.connect_timeout_ms);
  if (!fd.ok()) return Status::IoError("connect " + c->peer_ + ": " + fd.status().message());
  c->fd_ = *fd;
  c->reader_ = redisReaderCreate();
  c->buf_.reset(new char[kReadBuf]);
  if (!c->reader_) return Status::IoError("connect " + c->peer_ + ": out of memory");
  c->reader_->maxbuf = 0;  // keep the read buffer: values are ~1.4 MiB
  if (s.tls) {
    SetTimeouts(c->fd_, s.connect_timeout_ms);
    KVTIER_RETURN_IF_ERROR(c->Handshake(host, s));
  }
  SetTimeouts(c->fd_, s.command_timeout_ms);
  if (!s.password.empty()) KVTIER_RETURN_IF_ERROR(c->Auth(s));
  return c;
}

Status Connection::Handshake(const std::string& host, const ConnectSettings& s) {
  const TlsOptions& o = s.tls->options();
  ERR_clear_error();
  ssl_ = SSL_new(s.tls->ctx());
  BIO* bio = ssl_ ? BIO_new(SocketMethod()) : nullptr;
  if (!bio) return Fail(Status::IoError("TLS with " + peer_ + ": " + SslError()));
  BIO_set_fd(bio, fd_, BIO_NOCLOSE);
  SSL_set_bio(ssl_, bio, bio);
  SSL_set_app_data(ssl_, this);
  const std::string& name = o.server_name.empty() ? host : o.server_name;
  const bool ip = IsIpAddress(name);
  if (!ip) SSL_set_tlsext_host_name(ssl_, name.c_str());
  if (o.verify) {
    const int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), name.c_str())
                      : SSL_set1_host(ssl_, name.c_str());
    if (ok != 1) return Fail(Status::Invalid("TLS: \"" + name + "\" cannot be checked against a certificate"));
  }
  const int r = SSL_connect(ssl_);
  if (r == 1) return Status::Ok();
  const int saved_errno = errno;
  const long vr = SSL_get_verify_result(ssl_);
  if (o.verify && vr != X509_V_OK) {
    const bool name_err = vr == X509_V_ERR_HOSTNAME_MISMATCH || vr == X509_V_ERR_IP_ADDRESS_MISMATCH;
    ERR_clear_error();
    return Fail(Status::Rejected("TLS: the certificate of " + peer_ + " is not trusted: " +
                                 X509_verify_cert_error_string(vr) +
                                 (name_err ? " (for \"" + name + "\"; see tls_server_name)" : " (see tls_ca_file)")));
  }
  const int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_SSL) {
    return Fail(Status::Rejected("TLS handshake with " + peer_ + " failed: " + SslError() +
                                 " (does the node serve TLS on this port?)"));
  }
  ERR_clear_error();
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ||
      (e == SSL_ERROR_SYSCALL && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK))) {
    // A plain node waits for a line that a ClientHello never ends: a timeout too.
    return Fail(Status::IoError("TLS handshake with " + peer_ + " timed out (does the node serve TLS?)"));
  }
  return Fail(Status::IoError("TLS handshake with " + peer_ + ": " +
                              (saved_errno ? Errno(saved_errno) : std::string("closed by the node"))));
}

Status Connection::Auth(const ConnectSettings& s) {
  std::vector<std::string_view> argv = {"AUTH"};
  if (!s.user.empty()) argv.push_back(s.user);
  argv.push_back(s.password);
  Reply r;
  Status st = Command(argv, &r);
  if (!st.ok()) {
    // A TLS alert here (TLS 1.3 reports a refused client certificate only now) is a
    // refusal; anything else a failure to reach the node.
    return Fail(st);
  }
  if (r->type == REDIS_REPLY_ERROR) {
    return Fail(Status::Rejected("AUTH" + (s.user.empty() ? std::string() : " as user \"" + s.user + "\"") +
                                 " refused by " + peer_ + ": " + std::string(r->str, r->len)));
  }
  if (r->type != REDIS_REPLY_STATUS) return Fail(Status::IoError("AUTH: unexpected reply from " + peer_));
  return Status::Ok();
}

Status Connection::Append(std::span<const std::string_view> argv) {
  std::vector<const char*> a;
  std::vector<size_t> l;
  a.reserve(argv.size());
  l.reserve(argv.size());
  for (auto s : argv) {
    a.push_back(s.data());
    l.push_back(s.size());
  }
  char* cmd = nullptr;
  const int n = redisFormatCommandArgv(&cmd, static_cast<int>(a.size()), a.data(), l.data());
  if (n < 0 || !cmd) return Fail(Status::IoError("out of memory formatting a command"));
  pending_.emplace_back(cmd, static_cast<size_t>(n));
  return Status::Ok();
}

Status Connection::WriteAll(const char* p, size_t n) {
  while (n > 0) {
    if (ssl_) {
      ERR_clear_error();
      size_t w = 0;
      const int r = SSL_write_ex(ssl_, p, n, &w);
      if (r != 1) {
        const int saved_errno = errno;
        const int e = SSL_get_error(ssl_, r);
        if (e == SSL_ERROR_SSL) return Fail(Status::Rejected("TLS write to " + peer_ + ": " + SslError()));
        ERR_clear_error();
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
          return Fail(Status::IoError("write to " + peer_ + " timed out"));
        }
        return Fail(Status::IoError("write to " + peer_ + ": " + Errno(saved_errno)));
      }
      p += w;
      n -= w;
    } else {
      const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        return Fail(Status::IoError("write to " + peer_ + ": " +
                                    (errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : Errno(errno))));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  return Status::Ok();
}

Status Connection::Flush() {
  Status s = broken_ ? Status::IoError("connection to " + peer_ + " is broken") : Status::Ok();
  // Small commands are gathered into one write (one TLS record, one syscall); a large
  // one (a SET of a block) is written from hiredis's buffer as it is.
  std::string small;
  for (auto& [p, n] : pending_) {
    if (s.ok() && n <= kCoalesce) {
      small.append(p, n);
    } else if (s.ok()) {
      if (!small.empty()) s = WriteAll(small.data(), small.size());
      small.clear();
      if (s.ok()) s = WriteAll(p, n);
    }
    redisFreeCommand(p);
  }
  pending_.clear();
  if (s.ok() && !small.empty()) s = WriteAll(small.data(), small.size());
  return s;
}

StatusOr<size_t> Connection::ReadSome() {
  if (ssl_) {
    ERR_clear_error();
    size_t got = 0;
    const int r = SSL_read_ex(ssl_, buf_.get(), kReadBuf, &got);
    if (r == 1) return got;
    const int saved_errno = errno;
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_SSL) {
      const unsigned long err = ERR_peek_error();
      if (ERR_GET_REASON(err) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        return Fail(Status::IoError("connection closed by " + peer_));
      }
      return Fail(Status::Rejected("TLS read from " + peer_ + ": " + SslError()));
    }
    ERR_clear_error();
    if (e == SSL_ERROR_ZERO_RETURN) return Fail(Status::IoError("connection closed by " + peer_));
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ||
        (e == SSL_ERROR_SYSCALL && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK))) {
      return Fail(Status::IoError("read from " + peer_ + " timed out"));
    }
    return Fail(Status::IoError("read from " + peer_ + ": " +
                                (saved_errno ? Errno(saved_errno) : std::string("closed by the node"))));
  }
  for (;;) {
    const ssize_t r = ::recv(fd_, buf_.get(), kReadBuf, 0);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) return Fail(Status::IoError("connection closed by " + peer_));
    if (errno == EINTR) continue;
    return Fail(Status::IoError("read from " + peer_ + ": " +
                                (errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : Errno(errno))));
  }
}

Status Connection::Read(Reply* out) {
  if (broken_) return Status::IoError("connection to " + peer_ + " is broken");
  for (;;) {
    void* r = nullptr;
    if (redisReaderGetReply(reader_, &r) != REDIS_OK) {
      return Fail(Status::IoError("protocol error from " + peer_ + ": " + reader_->errstr));
    }
    if (r) {
      out->reset(static_cast<redisReply*>(r));
      return Status::Ok();
    }
    auto n = ReadSome();
    if (!n.ok()) return n.status();
    if (redisReaderFeed(reader_, buf_.get(), *n) != REDIS_OK) {
      return Fail(Status::IoError("protocol error from " + peer_ + ": " + reader_->errstr));
    }
  }
}

Status Connection::Command(std::span<const std::string_view> argv, Reply* out) {
  KVTIER_RETURN_IF_ERROR(Append(argv));
  KVTIER_RETURN_IF_ERROR(Flush());
  return Read(out);
}

}  // namespace kvtier::remote
