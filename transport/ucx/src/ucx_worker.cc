#include "ucx_worker.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtier/common/host_port.h"
#include "ucx_log.h"

namespace kvtier::ucx {

absl::StatusOr<sockaddr_storage> ResolveIpv4(const std::string& host_port, uint32_t min_port) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(host_port, min_port);
  if (!parsed.ok()) return parsed.status();
  const std::string host = IsWildcardHost(parsed->host) ? "0.0.0.0" : parsed->host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve \"", host, "\""));
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(static_cast<uint16_t>(parsed->port));
  return ss;
}

absl::StatusOr<std::shared_ptr<UcxContext>> UcxContext::Create(const std::string& transports,
                                                               const char* transports_key, bool several_workers) {
  InstallCmaFailureHandler();  // should a cma copy with a peer that died fail here
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return absl::UnavailableError("ucp_config_read failed");
  if (!transports.empty() && ucp_config_modify(config, "TLS", transports.c_str()) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(absl::StrCat(transports_key, ": UCX rejects \"", transports, "\""));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = several_workers ? 1 : 0;
  std::shared_ptr<UcxContext> context(new UcxContext());
  ucs_status_t st = ucp_init(&params, config, &context->context_);
  ucp_config_release(config);
  if (st != UCS_OK) return absl::UnavailableError(absl::StrCat("ucp_init: ", ucs_status_string(st)));
  return context;
}

UcxContext::~UcxContext() {
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(std::shared_ptr<UcxContext> context) {
  std::unique_ptr<UcxWorker> w(new UcxWorker(std::move(context)));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the worker's own thread calls UCX on it
  if (ucs_status_t st = ucp_worker_create(w->context(), &wp, &w->worker_); st != UCS_OK) {
    w->worker_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucp_worker_create: ", ucs_status_string(st)));
  }
  if (ucs_status_t st = ucp_worker_get_efd(w->worker_, &w->worker_fd_); st != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_worker_get_efd: ", ucs_status_string(st)));
  }
  w->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->wake_fd_ < 0) return absl::UnavailableError("eventfd failed");
  return w;
}

UcxWorker::~UcxWorker() {
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::Status UcxWorker::SetAmHandler(uint16_t id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                  UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = id;
  hp.cb = cb;
  hp.arg = arg;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  if (ucs_status_t st = ucp_worker_set_am_recv_handler(worker_, &hp); st != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_worker_set_am_recv_handler: ", ucs_status_string(st)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ucp_ep_h> UcxWorker::Connect(const sockaddr_storage& addr, ucp_err_handler_cb_t on_error, void* arg) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  p.sockaddr.addrlen = sizeof(sockaddr_in);
  p.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // see the class comment
  if (on_error != nullptr) {
    p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.err_handler.cb = on_error;
    p.err_handler.arg = arg;
  }
  ucp_ep_h ep = nullptr;
  if (ucs_status_t st = ucp_ep_create(worker_, &p, &ep); st != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_ep_create: ", ucs_status_string(st)));
  }
  return ep;
}

absl::StatusOr<ucp_ep_h> UcxWorker::Accept(ucp_conn_request_h request, ucp_err_handler_cb_t on_error, void* arg) {
  ucp_ep_params_t p{};
  p.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.conn_request = request;
  p.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // see the class comment
  p.err_handler.cb = on_error;
  p.err_handler.arg = arg;
  ucp_ep_h ep = nullptr;
  if (ucs_status_t st = ucp_ep_create(worker_, &p, &ep); st != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_ep_create: ", ucs_status_string(st)));
  }
  return ep;
}

void UcxWorker::CloseEndpoint(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
}

void UcxWorker::ReapCloses() {
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i]);
      closing_[i] = closing_.back();
      closing_.pop_back();
    } else {
      ++i;
    }
  }
}

void UcxWorker::DrainCloses(absl::Time until) {
  while (!closing_.empty() && absl::Now() < until) {
    ucp_worker_progress(worker_);
    ReapCloses();
  }
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
}

ucs_status_t UcxWorker::SendEagerAm(ucp_ep_h ep, uint16_t id, std::string payload, bool reply) {
  auto* buf = new std::string(std::move(payload));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<std::string*>(user_data);
    ucp_request_free(request);
  };
  p.user_data = buf;
  p.flags = UCP_AM_SEND_FLAG_EAGER | (reply ? static_cast<uint32_t>(UCP_AM_SEND_FLAG_REPLY) : 0u);
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, nullptr, 0, buf->data(), buf->size(), &p);
  if (UCS_PTR_IS_PTR(r)) return UCS_OK;
  delete buf;  // done at once, or failed
  return UCS_PTR_STATUS(r);
}

bool UcxWorker::DropRendezvous(void* data, const ucp_am_recv_param_t* param) const {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) return false;
  ucp_am_data_release(worker_, data);
  return true;
}

void UcxWorker::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void UcxWorker::Sleep(absl::Duration limit) {
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
  pollfd fds[2] = {{.fd = worker_fd_, .events = POLLIN, .revents = 0},
                   {.fd = wake_fd_, .events = POLLIN, .revents = 0}};
  poll(fds, 2, static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(limit))));
  uint64_t drained;
  if (fds[1].revents != 0) (void)!read(wake_fd_, &drained, sizeof(drained));
}

}  // namespace kvtier::ucx
