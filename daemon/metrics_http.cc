// kvtierd's /metrics endpoint (Boost.Beast over loopback HTTP): the listener, with the
// control socket's fd-exhaustion back-off and a cap on exchanges at once, and one
// bounded exchange per connection. The only file of the daemon that includes Beast.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include "daemon/server_impl.h"

namespace kvtier::daemon {

namespace beast = boost::beast;
namespace http = boost::beast::http;

namespace {

// Bytes of a /metrics request: its header (a scraper sends a few hundred) and its body
// (a GET has none). A request past either is answered 413 and closed, having cost no more.
inline constexpr uint32_t kMetricsHeaderLimit = 8192;
inline constexpr uint64_t kMetricsRequestLimit = 4096;

// One /metrics HTTP exchange; it holds one of daemon.metrics_max_connections places
// until it ends (io thread only).
class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  HttpExchange(asio::ip::tcp::socket s, Daemon::Impl* d) : stream_(std::move(s)), d_(d) {
    ++d_->metrics_conns_;
    parser_.header_limit(kMetricsHeaderLimit);
    parser_.body_limit(kMetricsRequestLimit);
  }
  ~HttpExchange() { --d_->metrics_conns_; }
  void Start() {
    stream_.expires_after(std::chrono::seconds(5));
    auto self = shared_from_this();
    http::async_read(stream_, buf_, parser_, [self](beast::error_code ec, size_t) {
      if (ec == http::error::body_limit || ec == http::error::header_limit) return self->TooLarge();
      if (ec) return;
      self->req_ = self->parser_.release();
      self->Respond();
    });
  }

 private:
  void TooLarge() {
    res_.version(11);
    res_.keep_alive(false);
    res_.result(http::status::payload_too_large);
    res_.set(http::field::content_type, "text/plain");
    res_.body() = "request over " + std::to_string(kMetricsHeaderLimit) + " header bytes or " +
                  std::to_string(kMetricsRequestLimit) + " body bytes\n";
    Send();
  }

  void Respond() {
    res_.version(req_.version());
    res_.keep_alive(false);
    const std::string target(req_.target());
    if (req_.method() != http::verb::get) {
      res_.result(http::status::method_not_allowed);
      res_.set(http::field::content_type, "text/plain");
      res_.body() = "GET only\n";
    } else if (target == "/metrics" || target.rfind("/metrics?", 0) == 0) {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res_.body() = d_->metrics_.Render(d_->tm_->Stats());
      Metrics::RenderClientBudget(d_->tm_->ClientBudgetRejects(), &res_.body());
      // Per-tenant series only where the operator keeps the port from the tenants.
      if (d_->opts_.config.daemon.metrics_tenants) Metrics::RenderTenants(d_->TenantRows(), &res_.body());
    } else {
      res_.result(http::status::not_found);
      res_.set(http::field::content_type, "text/plain");
      res_.body() = "kvtierd: see /metrics\n";
    }
    Send();
  }

  void Send() {
    res_.prepare_payload();
    auto self = shared_from_this();
    http::async_write(stream_, res_, [self](beast::error_code, size_t) {
      beast::error_code ec;
      self->stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ec);
    });
  }

  beast::tcp_stream stream_;
  Daemon::Impl* d_;
  beast::flat_buffer buf_;
  http::request_parser<http::string_body> parser_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
};

}  // namespace

// Binds daemon.metrics_address:metrics_port (the socket file is removed again on failure).
Status Daemon::Impl::ListenMetrics() {
  const config::Config& c = opts_.config;
  boost::system::error_code bec;
  const std::string addr = c.daemon.metrics_address == "localhost" ? "127.0.0.1" : c.daemon.metrics_address;
  asio::ip::tcp::endpoint ep(asio::ip::make_address(addr, bec), static_cast<uint16_t>(c.daemon.metrics_port));
  if (bec) return Status::Invalid("daemon.metrics_address: " + bec.message());
  metrics_acceptor_ = std::make_unique<asio::ip::tcp::acceptor>(io_);
  metrics_acceptor_->open(ep.protocol(), bec);
  if (!bec) metrics_acceptor_->set_option(asio::socket_base::reuse_address(true), bec);
  if (!bec) metrics_acceptor_->bind(ep, bec);
  if (!bec) metrics_acceptor_->listen(asio::socket_base::max_listen_connections, bec);
  if (bec) {
    ::unlink(socket_path_.c_str());
    return Status::IoError("daemon.metrics_port: cannot listen on " + addr + ":" +
                           std::to_string(c.daemon.metrics_port) + ": " + bec.message());
  }
  metrics_url_ = "http://" + (addr.find(':') != std::string::npos ? "[" + addr + "]" : addr) + ":" +
                 std::to_string(c.daemon.metrics_port) + "/metrics";
  return Status::Ok();
}

// The metrics listener: the control socket's fd-exhaustion back-off (a full fd table
// costs neither a spinning core nor a line per try) and at most
// daemon.metrics_max_connections exchanges at once (each bounded by kMetricsRequestLimit
// and a deadline); past it a new connection is closed at accept.
void Daemon::Impl::AcceptMetrics() {
  metrics_acceptor_->async_accept([this](const boost::system::error_code& ec, asio::ip::tcp::socket s) {
    if (ec == asio::error::operation_aborted || shutting_down_) return;
    if (ec) {
      const bool no_fds = ec.value() == EMFILE || ec.value() == ENFILE;
      if (uint64_t held = 0; metrics_log_.Allow(&held)) {
        spdlog::warn("metrics accept: {}{} ({} more such lines held back)", ec.message(),
                     no_fds ? "; closing new connections until descriptors are free" : "", held);
      }
      if (no_fds) ShedPending(metrics_acceptor_->native_handle());
      metrics_backoff_->expires_after(std::chrono::milliseconds(no_fds ? 100 : 10));
      metrics_backoff_->async_wait([this](const boost::system::error_code& tec) {
        if (!tec && !shutting_down_) AcceptMetrics();
      });
      return;
    }
    if (metrics_conns_ >= opts_.config.daemon.metrics_max_connections) {
      if (uint64_t held = 0; metrics_log_.Allow(&held)) {
        spdlog::warn("metrics accept: daemon.metrics_max_connections ({}) connections open; closing a new one "
                     "({} more such lines held back)",
                     opts_.config.daemon.metrics_max_connections, held);
      }
      boost::system::error_code cec;
      s.close(cec);
    } else {
      std::make_shared<HttpExchange>(std::move(s), this)->Start();
    }
    AcceptMetrics();
  });
}

}  // namespace kvtier::daemon
