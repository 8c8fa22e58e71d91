#include "kvtier/wire/channel_security.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <vector>

#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/str_cat.h"

namespace kvtier::wire {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& field, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(field, ": ", path, " cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " holds no PEM block"));
  }
  return text;
}

// Adds `authorization: Bearer <token>` to the initial metadata of every call of its channel.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;  // owned by the factory, which the channel keeps
};

class BearerInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token) : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&value_);
  }

 private:
  const std::string value_;
};

// `prefix` + `field`, spelled as a flag ("--tls-ca-file") when the prefix is one.
std::string Field(const std::string& prefix, std::string field) {
  if (prefix.rfind("--", 0) == 0) std::replace(field.begin(), field.end(), '_', '-');
  return absl::StrCat(prefix, field);
}

}  // namespace

absl::Status ChannelSecurity::Validate(const std::string& prefix) const {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Field(prefix, cert_file.empty() ? "cert_file" : "key_file"),
                                                   ": the client certificate and key go together"));
  }
  if (!cert_file.empty() && ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Field(prefix, "ca_file"), ": is required with a client certificate (TLS)"));
  }
  if (!server_name.empty() && ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Field(prefix, "server_name"), ": needs TLS (", Field(prefix, "ca_file"), ")"));
  }
  if (auth_token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("auth_token: holds a line break");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const ChannelSecurity& security,
                                                                                 const std::string& prefix) {
  if (absl::Status s = security.Validate(prefix); !s.ok()) return s;
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  auto roots = ReadPem(Field(prefix, "ca_file"), security.ca_file);
  if (!roots.ok()) return roots.status();
  ssl.pem_root_certs = *std::move(roots);
  if (!security.cert_file.empty()) {
    auto cert = ReadPem(Field(prefix, "cert_file"), security.cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(Field(prefix, "key_file"), security.key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::Channel> CreateSecureChannel(const std::string& address,
                                                   const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                                   grpc::ChannelArguments args, const ChannelSecurity& security) {
  if (!security.server_name.empty()) args.SetSslTargetNameOverride(security.server_name);
  if (security.auth_token.empty()) return grpc::CreateCustomChannel(address, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerInterceptorFactory>(security.auth_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args, std::move(interceptors));
}

}  // namespace kvtier::wire
