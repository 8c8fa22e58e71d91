// kvtier._kvtier: the Python binding of the C++ client (DESIGN.md §5). The pure-Python package
// `kvtier` (kvtier/__init__.py) re-exports everything defined here; kvtier/_kvtier.pyi is its stub.
//
// Rules of this file:
//  - Python objects are converted while the GIL is held; client I/O and hashing run with it released
//    (py::gil_scoped_release), so other Python threads proceed during a transfer.
//  - absl::Status becomes a kvtier.Error subclass in one place (ThrowStatus).
//  - Caller memory is borrowed only for the call (buffers.h).
#include <openssl/evp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "buffers.h"
#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/kv_layout.h"
#include "kvtier/common/namespace.h"
#include "module_parts.h"

namespace kvtier::python {
namespace {

using client::Client;
using client::ClientOptions;
using client::GetResult;
using client::PutOptions;
using client::PutResult;

// ---------------------------------------------------------------------------------------------------
// Errors

struct ErrorClasses {
  py::object base;              // kvtier.Error(RuntimeError)
  py::object invalid_argument;  // kvtier.InvalidArgumentError(Error, ValueError)
  py::object unavailable;       // kvtier.UnavailableError(Error, ConnectionError)
};

ErrorClasses& Errors() {
  static ErrorClasses* classes = new ErrorClasses();  // lives as long as the interpreter; never freed
  return *classes;
}

const char* CodeName(absl::StatusCode code) {
  // absl::StatusCodeToString gives "INVALID_ARGUMENT" etc.; keep a copy so the pointer is stable.
  static const std::vector<std::string>* names = [] {
    auto* v = new std::vector<std::string>();
    for (int c = 0; c <= 16; ++c) v->push_back(absl::StatusCodeToString(static_cast<absl::StatusCode>(c)));
    return v;
  }();
  const int c = static_cast<int>(code);
  return c >= 0 && c < static_cast<int>(names->size()) ? (*names)[c].c_str() : "UNKNOWN";
}

[[noreturn]] void ThrowStatus(const absl::Status& s) {
  ErrorClasses& e = Errors();
  py::object cls = e.base;
  if (s.code() == absl::StatusCode::kInvalidArgument) cls = e.invalid_argument;
  if (s.code() == absl::StatusCode::kUnavailable) cls = e.unavailable;
  py::object exc = cls(py::str(std::string(s.message())));
  exc.attr("code") = static_cast<int>(s.code());
  exc.attr("code_name") = CodeName(s.code());
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  if (!v.ok()) ThrowStatus(v.status());
  return std::move(v).value();
}

void OkOrThrow(const absl::Status& s) {
  if (!s.ok()) ThrowStatus(s);
}

// ---------------------------------------------------------------------------------------------------
// Layouts and namespaces

constexpr const char* kLayoutFields[] = {"kind",     "dtype",      "codec",        "num_layers", "num_kv_heads",
                                         "head_dim", "latent_dim", "block_tokens", "tp_size",    "quant_group_size"};

uint32_t ToU32(py::handle v, const char* field) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
    throw py::type_error(absl::StrCat("layout.", field, ": must be an int"));
  }
  const auto x = v.cast<long long>();
  if (x < 0 || x > 0xFFFFFFFFLL) throw py::value_error(absl::StrCat("layout.", field, ": ", x, " is out of range"));
  return static_cast<uint32_t>(x);
}

// A non-negative int argument (an int or an object with __index__, such as a numpy integer), at most
// `max`. Raises TypeError (not an int) or ValueError (negative or above `max`) naming `what`.
uint64_t ToUnsigned(py::handle v, const std::string& what, uint64_t max) {
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr())) {
    throw py::type_error(absl::StrCat(what, ": must be an int"));
  }
  const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int sign = 0;  // PyLong_AsLongLongAndOverflow sets it to -1 or 1 when the value does not fit
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &sign);
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (sign < 0 || (sign == 0 && x < 0)) {
    throw py::value_error(absl::StrCat(what, ": ", std::string(py::str(i)), " is negative"));
  }
  uint64_t u = static_cast<uint64_t>(x);
  if (sign > 0) {
    u = PyLong_AsUnsignedLongLong(i.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw py::value_error(absl::StrCat(what, ": ", std::string(py::str(i)), " does not fit in 64 bits"));
    }
  }
  if (u > max) throw py::value_error(absl::StrCat(what, ": ", u, " is above the limit of ", max));
  return u;
}

std::string ToName(py::handle v, const char* field) {
  if (!py::isinstance<py::str>(v)) throw py::type_error(absl::StrCat("layout.", field, ": must be a str"));
  return v.cast<std::string>();
}

// Applies the entries of `fields` (a dict of layout field -> value) to `layout`.
void ApplyLayoutFields(const py::dict& fields, KvLayout& layout) {
  for (auto [k, v] : fields) {
    const std::string key = py::str(k);
    if (key == "kind")
      layout.kind = ValueOrThrow(ParseLayoutKind(ToName(v, "kind")));
    else if (key == "dtype")
      layout.dtype = ValueOrThrow(ParseDType(ToName(v, "dtype")));
    else if (key == "codec")
      layout.codec = ValueOrThrow(ParseCodec(ToName(v, "codec")));
    else if (key == "num_layers")
      layout.num_layers = ToU32(v, "num_layers");
    else if (key == "num_kv_heads")
      layout.num_kv_heads = ToU32(v, "num_kv_heads");
    else if (key == "head_dim")
      layout.head_dim = ToU32(v, "head_dim");
    else if (key == "latent_dim")
      layout.latent_dim = ToU32(v, "latent_dim");
    else if (key == "block_tokens")
      layout.block_tokens = ToU32(v, "block_tokens");
    else if (key == "tp_size")
      layout.tp_size = ToU32(v, "tp_size");
    else if (key == "quant_group_size")
      layout.quant_group_size = ToU32(v, "quant_group_size");
    else {
      throw py::type_error(
          absl::StrCat("unknown layout field '", key, "'; the fields are ", absl::StrJoin(kLayoutFields, ", ")));
    }
  }
}

py::dict LayoutToDict(const KvLayout& l) {
  py::dict d;
  d["kind"] = LayoutKindName(l.kind);
  d["dtype"] = DTypeName(l.dtype);
  d["codec"] = CodecName(l.codec);
  d["num_layers"] = l.num_layers;
  d["num_kv_heads"] = l.num_kv_heads;
  d["head_dim"] = l.head_dim;
  d["latent_dim"] = l.latent_dim;
  d["block_tokens"] = l.block_tokens;
  d["tp_size"] = l.tp_size;
  d["quant_group_size"] = l.quant_group_size;
  return d;
}

KvLayout MakeLayout(const py::kwargs& kwargs) {
  KvLayout l;
  ApplyLayoutFields(kwargs, l);
  OkOrThrow(l.Validate());
  return l;
}

// Bytes of a str (UTF-8) or a bytes-like object.
std::string ToBytes(py::handle v, const std::string& what) {
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::bytes>(v)) return v.cast<std::string>();
  if (PyObject_CheckBuffer(v.ptr())) {
    BorrowedBuffer b = BorrowedBuffer::Acquire(v, /*writable=*/false, what);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size_bytes());
  }
  throw py::type_error(absl::StrCat(what, ": must be str or bytes"));
}

Namespace MakeNamespace(const std::string& tenant, const std::string& model, std::optional<std::string> revision,
                        py::object layout, py::object tenant_salt, const py::kwargs& layout_fields) {
  Namespace ns;
  ns.tenant = tenant;
  ns.model = model;
  ns.revision = std::move(revision);
  if (!layout.is_none()) {
    if (py::isinstance<KvLayout>(layout)) {
      ns.layout = layout.cast<KvLayout>();
    } else if (py::isinstance<py::dict>(layout)) {
      ApplyLayoutFields(layout.cast<py::dict>(), ns.layout);
    } else {
      throw py::type_error("layout: must be a kvtier.KvLayout or a dict of layout fields");
    }
  }
  ApplyLayoutFields(layout_fields, ns.layout);
  if (!tenant_salt.is_none()) ns.tenant_salt = ToBytes(tenant_salt, "tenant_salt");
  OkOrThrow(ns.Validate());
  return ns;
}

// ---------------------------------------------------------------------------------------------------
// Tokens, fingerprints and extra keys

}  // namespace

// ToTokens and ToFingerprints are shared with the other parts of the module (module_parts.h).
std::vector<uint32_t> ToTokens(py::handle tokens) {
  std::vector<uint32_t> out;
  auto put = [&](long long v, size_t i) {
    if (v < 0 || v > 0xFFFFFFFFLL) {
      throw py::value_error(absl::StrCat("tokens[", i, "]: ", v, " is not a uint32 token id"));
    }
    out.push_back(static_cast<uint32_t>(v));
  };
  if (PyObject_CheckBuffer(tokens.ptr()) && !py::isinstance<py::bytes>(tokens) &&
      !py::isinstance<py::bytearray>(tokens)) {
    // A 1-D integer array (numpy, array.array, memoryview): read it with its own strides.
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(tokens).request();
    if (info.ndim != 1) throw py::value_error(absl::StrCat("tokens: must be 1-D, got ", info.ndim, " dimensions"));
    const std::string fmt = info.format;
    const char f = fmt.empty() ? '?' : fmt.back();  // strip byte-order prefixes such as '<' or '='
    const bool is_signed = f == 'b' || f == 'h' || f == 'i' || f == 'l' || f == 'q';
    const bool is_unsigned = f == 'B' || f == 'H' || f == 'I' || f == 'L' || f == 'Q';
    if (!is_signed && !is_unsigned) {
      throw py::type_error(absl::StrCat("tokens: an integer array is required, got format '", fmt, "'"));
    }
    out.reserve(static_cast<size_t>(info.shape[0]));
    const auto* base = static_cast<const char*>(info.ptr);
    for (py::ssize_t i = 0; i < info.shape[0]; ++i) {
      const char* p = base + i * info.strides[0];
      long long v = 0;
      switch (info.itemsize) {
        case 1:
          v = is_signed ? static_cast<long long>(*reinterpret_cast<const int8_t*>(p))
                        : *reinterpret_cast<const uint8_t*>(p);
          break;
        case 2: {
          int16_t s;
          uint16_t u;
          std::memcpy(&s, p, 2);
          std::memcpy(&u, p, 2);
          v = is_signed ? s : u;
          break;
        }
        case 4: {
          int32_t s;
          uint32_t u;
          std::memcpy(&s, p, 4);
          std::memcpy(&u, p, 4);
          v = is_signed ? static_cast<long long>(s) : static_cast<long long>(u);
          break;
        }
        case 8: {
          int64_t s;
          uint64_t u;
          std::memcpy(&s, p, 8);
          std::memcpy(&u, p, 8);
          v = is_signed ? s : (u > 0xFFFFFFFFULL ? -1 : static_cast<long long>(u));
          break;
        }
        default:
          throw py::type_error(absl::StrCat("tokens: unsupported item size ", info.itemsize));
      }
      put(v, static_cast<size_t>(i));
    }
    return out;
  }
  if (!PySequence_Check(tokens.ptr()) || py::isinstance<py::str>(tokens) || py::isinstance<py::bytes>(tokens) ||
      py::isinstance<py::bytearray>(tokens)) {
    throw py::type_error("tokens: must be a sequence of ints or a 1-D integer array");
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(tokens);
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) {
    py::object item = seq[i];
    if (!py::isinstance<py::int_>(item) && !PyIndex_Check(item.ptr())) {
      throw py::type_error(absl::StrCat("tokens[", i, "]: must be an int"));
    }
    put(py::int_(item).cast<long long>(), i);
  }
  return out;
}

Fingerprint OneFingerprint(py::handle v, const std::string& what) {
  Fingerprint fp;
  if (py::isinstance<py::str>(v)) return ValueOrThrow(Fingerprint::FromHex(v.cast<std::string>()));
  const std::string bytes = ToBytes(v, what);
  if (bytes.size() != fp.bytes.size()) {
    throw py::value_error(absl::StrCat(what, ": is ", bytes.size(), " bytes, want 32"));
  }
  std::memcpy(fp.bytes.data(), bytes.data(), fp.bytes.size());
  return fp;
}

// A list/tuple of 32-byte values (bytes, bytearray, memoryview, numpy rows, or 64-char hex strings), or
// one buffer of 32 * n bytes (e.g. the uint8 [n, 32] array that fingerprints(as_numpy=True) returns).
std::vector<Fingerprint> ToFingerprints(py::handle fps) {
  std::vector<Fingerprint> out;
  if (py::isinstance<py::list>(fps) || py::isinstance<py::tuple>(fps)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(fps);
    out.reserve(seq.size());
    for (size_t i = 0; i < seq.size(); ++i)
      out.push_back(OneFingerprint(seq[i], absl::StrCat("fingerprints[", i, "]")));
    return out;
  }
  if (PyObject_CheckBuffer(fps.ptr())) {
    BorrowedBuffer b = BorrowedBuffer::Acquire(fps, /*writable=*/false, "fingerprints");
    if (b.size_bytes() % 32 != 0) {
      throw py::value_error(absl::StrCat("fingerprints: ", b.size_bytes(), " bytes is not a multiple of 32"));
    }
    out.resize(b.size_bytes() / 32);
    for (size_t i = 0; i < out.size(); ++i) std::memcpy(out[i].bytes.data(), b.data() + 32 * i, 32);
    return out;
  }
  throw py::type_error("fingerprints: must be a list of 32-byte values or one buffer of 32 * n bytes");
}

namespace {

ExtraKeys ToExtraKeys(py::object lora, py::object cache_salt, py::object multimodal) {
  ExtraKeys keys;
  if (!lora.is_none()) {
    // (adapter_id, version) or {"adapter_id": ..., "version": ...}
    LoraKey k;
    if (py::isinstance<py::dict>(lora)) {
      py::dict d = lora.cast<py::dict>();
      k.adapter_id = ToBytes(d["adapter_id"], "lora['adapter_id']");
      if (d.contains("version")) k.version = ToUnsigned(d["version"], "lora['version']", UINT64_MAX);
    } else if (py::isinstance<py::tuple>(lora) || py::isinstance<py::list>(lora)) {
      py::sequence s = lora.cast<py::sequence>();
      if (s.size() != 2) throw py::value_error("lora: must be (adapter_id, version)");
      k.adapter_id = ToBytes(s[0], "lora[0]");
      k.version = ToUnsigned(s[1], "lora[1]", UINT64_MAX);
    } else {
      k.adapter_id = ToBytes(lora, "lora");
    }
    keys.lora = std::move(k);
  }
  if (!cache_salt.is_none()) keys.cache_salt = ToBytes(cache_salt, "cache_salt");
  if (!multimodal.is_none()) {
    py::sequence items = multimodal.cast<py::sequence>();
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string what = absl::StrCat("multimodal[", i, "]");
      py::sequence m = items[i].cast<py::sequence>();
      if (m.size() != 3)
        throw py::value_error(absl::StrCat(what, ": must be (content_hash, offset_tokens, length_tokens)"));
      const auto offset_tokens = static_cast<uint32_t>(ToUnsigned(m[1], what + "[1] (offset_tokens)", UINT32_MAX));
      const auto length_tokens = static_cast<uint32_t>(ToUnsigned(m[2], what + "[2] (length_tokens)", UINT32_MAX));
      keys.multimodal.push_back({.content_hash = ToBytes(m[0], what + "[0]"),
                                 .offset_tokens = offset_tokens,
                                 .length_tokens = length_tokens});
    }
  }
  return keys;
}

py::object FingerprintsToPython(const std::vector<Fingerprint>& fps, bool as_numpy) {
  if (as_numpy) {
    py::module_ np = py::module_::import("numpy");
    py::object arr = np.attr("empty")(py::make_tuple(fps.size(), 32), "uint8");
    BorrowedBuffer b = BorrowedBuffer::Acquire(arr, /*writable=*/true, "result");
    for (size_t i = 0; i < fps.size(); ++i) std::memcpy(b.data() + 32 * i, fps[i].bytes.data(), 32);
    return arr;
  }
  py::list out(fps.size());
  for (size_t i = 0; i < fps.size(); ++i) {
    out[i] = py::bytes(reinterpret_cast<const char*>(fps[i].bytes.data()), fps[i].bytes.size());
  }
  return out;
}

py::object Fingerprints(const Namespace& ns, py::handle tokens, py::object lora, py::object cache_salt,
                        py::object multimodal, bool as_numpy) {
  const std::vector<uint32_t> ids = ToTokens(tokens);
  const ExtraKeys extra = ToExtraKeys(std::move(lora), std::move(cache_salt), std::move(multimodal));
  absl::StatusOr<std::vector<Fingerprint>> fps;
  {
    py::gil_scoped_release release;
    fps = ChainFingerprints(ns, ids, extra);
  }
  return FingerprintsToPython(ValueOrThrow(std::move(fps)), as_numpy);
}

// Fingerprints for blocks an engine names itself (SGLang's page hashes, for example): each key becomes
//   SHA-256("kvtier.external-key.v1" || 0x00 || u32le(len(C)) || C || u8(has_salt) || u32le(len(S)) || S
//           || u32le(len(K)) || K)
// with C = ns.CanonicalBytes(), S = the tenant salt and K the key's bytes (UTF-8 for str). Keys of
// different namespaces or tenants never collide, and none equals a ChainFingerprints value (those hash
// other inputs). Deterministic across machines; no process seed.
py::object ExternalKeyFingerprints(const Namespace& ns, const py::sequence& keys, bool as_numpy) {
  std::vector<std::string> raw;
  raw.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    raw.push_back(ToBytes(keys[i], absl::StrCat("keys[", i, "]")));
    if (raw.back().size() > UINT32_MAX) {  // its length is hashed as a u32
      throw py::value_error(absl::StrCat("keys[", i, "]: is ", raw.back().size(), " bytes, more than 2^32 - 1"));
    }
  }
  std::vector<Fingerprint> fps(raw.size());
  {
    py::gil_scoped_release release;
    auto u32 = [](std::string& s, uint32_t v) {
      for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    };
    std::string prefix = std::string("kvtier.external-key.v1") + '\0';
    const std::string canonical = ns.CanonicalBytes();
    u32(prefix, static_cast<uint32_t>(canonical.size()));
    prefix += canonical;
    prefix.push_back(ns.tenant_salt.has_value() ? 1 : 0);
    const std::string salt = ns.tenant_salt.value_or("");
    u32(prefix, static_cast<uint32_t>(salt.size()));
    prefix += salt;
    for (size_t i = 0; i < raw.size(); ++i) {
      std::string msg = prefix;
      u32(msg, static_cast<uint32_t>(raw[i].size()));
      msg += raw[i];
      unsigned int len = 0;
      EVP_Digest(msg.data(), msg.size(), fps[i].bytes.data(), &len, EVP_sha256(), nullptr);
    }
  }
  return FingerprintsToPython(fps, as_numpy);
}

// ---------------------------------------------------------------------------------------------------
// Client

// The Python Client: a shared_ptr so that close() while another thread is inside a call (GIL released)
// only drops this reference; the C++ client is destroyed when the last call returns.
class PyClient {
 public:
  PyClient(std::shared_ptr<Client> c, ClientOptions options) : client_(std::move(c)), options_(std::move(options)) {}

  std::shared_ptr<Client> Get() const {
    if (client_ == nullptr) ThrowStatus(absl::FailedPreconditionError("kvtier.Client: closed"));
    return client_;
  }
  void Close() {
    std::shared_ptr<Client> c = std::move(client_);
    py::gil_scoped_release release;  // closing channels may wait on gRPC threads
    c.reset();
  }
  bool closed() const { return client_ == nullptr; }
  const ClientOptions& options() const { return options_; }

 private:
  std::shared_ptr<Client> client_;
  ClientOptions options_;  // what the client was connected with
};

// Client(members=None, *, options=None, **fields): see ClientOptionsFromPython (options.cc).
PyClient Connect(py::handle members, py::handle options, const py::kwargs& fields) {
  ClientOptions o = ClientOptionsFromPython(options, members, fields);
  absl::StatusOr<std::unique_ptr<Client>> c;
  {
    py::gil_scoped_release release;
    c = Client::Connect(o);
  }
  return PyClient(std::shared_ptr<Client>(ValueOrThrow(std::move(c))), std::move(o));
}

struct PyLookupResult {
  uint32_t prefix_blocks = 0;
  uint64_t prefix_tokens = 0;  // block_tokens may be near 2^32: a product of two u32s needs 64 bits
  std::vector<bool> present;
  uint32_t blocks_from_errors = 0;
};

PyLookupResult LookupDetail(const PyClient& self, const Namespace& ns, py::handle fingerprints) {
  std::shared_ptr<Client> c = self.Get();
  const std::vector<Fingerprint> fps = ToFingerprints(fingerprints);
  absl::StatusOr<client::LookupResult> r;
  {
    py::gil_scoped_release release;
    r = c->LookupPrefix(ns, fps);
  }
  client::LookupResult v = ValueOrThrow(std::move(r));
  return {.prefix_blocks = v.prefix_blocks,
          .prefix_tokens = uint64_t{v.prefix_blocks} * ns.layout.block_tokens,
          .present = std::move(v.present),
          .blocks_from_errors = v.blocks_from_errors};
}

std::vector<GetResult> GetBlocks(const PyClient& self, const Namespace& ns, py::handle fingerprints, py::handle buffers,
                                 uint32_t shard) {
  std::shared_ptr<Client> c = self.Get();
  const std::vector<Fingerprint> fps = ToFingerprints(fingerprints);
  BlockBuffers bufs = AcquireBlocks(buffers, fps.size(), ns.layout.ShardBytes(), /*writable=*/true);
  absl::StatusOr<std::vector<GetResult>> r;
  {
    py::gil_scoped_release release;
    r = c->Get(ns, fps, shard, bufs.blocks);
  }
  return ValueOrThrow(std::move(r));
}

// An engine block hash from Python: an int in [-2^63, 2^64) or bytes. None: no hash.
EngineBlockHash ToEngineHash(py::handle h, const char* what) {
  if (h.is_none()) return EngineBlockHash();
  if (py::isinstance<py::bytes>(h)) return EngineBlockHash::Bytes(h.cast<std::string>());
  if (py::isinstance<py::int_>(h)) {
    const py::int_ v = py::reinterpret_borrow<py::int_>(h);
    if (v < py::int_(0)) {
      if (v < py::int_(INT64_MIN)) throw py::value_error(absl::StrCat(what, ": below -2**63"));
      return EngineBlockHash::Int(v.cast<int64_t>());
    }
    if (v > py::int_(UINT64_MAX)) throw py::value_error(absl::StrCat(what, ": above 2**64 - 1"));
    return EngineBlockHash::Uint(v.cast<uint64_t>());
  }
  throw py::type_error(absl::StrCat(what, ": an engine block hash is an int or bytes"));
}

// PutOptions::block_meta from put()'s keyword arguments: block_hashes (one int or bytes per block, or
// None), token_ids (one sequence of ints per block, or None), lora_id (an int for every block, or None).
// Empty when all are None. Raises ValueError on counts that are not one per block.
std::vector<BlockMeta> ToBlockMeta(size_t n, py::handle block_hashes, py::handle token_ids, py::handle lora_id) {
  std::vector<BlockMeta> meta;
  if (block_hashes.is_none() && token_ids.is_none() && lora_id.is_none()) return meta;
  meta.resize(n);
  if (!block_hashes.is_none()) {
    const py::sequence hs = py::reinterpret_borrow<py::sequence>(block_hashes);
    if (static_cast<size_t>(py::len(hs)) != n) {
      throw py::value_error(absl::StrCat("block_hashes: ", py::len(hs), " for ", n, " blocks"));
    }
    for (size_t i = 0; i < n; ++i) meta[i].hash = ToEngineHash(hs[i], "block_hashes");
  }
  if (!token_ids.is_none()) {
    const py::sequence ts = py::reinterpret_borrow<py::sequence>(token_ids);
    if (static_cast<size_t>(py::len(ts)) != n) {
      throw py::value_error(absl::StrCat("token_ids: ", py::len(ts), " for ", n, " blocks"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (ts[i].is_none()) continue;
      for (py::handle t : py::reinterpret_borrow<py::sequence>(ts[i])) meta[i].token_ids.push_back(t.cast<uint32_t>());
    }
  }
  if (!lora_id.is_none()) {
    const int64_t id = lora_id.cast<int64_t>();
    for (BlockMeta& m : meta) m.lora_id = id;
  }
  return meta;
}

// put()'s and put_ptrs()'s keyword arguments: the engine's block metadata (ToBlockMeta), the parent
// block's engine hash and fingerprint. The metadata lives in `meta`, which must outlive the options.
struct PyPutMeta {
  py::handle block_hashes, token_ids, lora_id, parent_hash, parent_fingerprint;
};

PutOptions ToPutOptions(size_t n, uint32_t first_block_index, const PyPutMeta& kw, std::vector<BlockMeta>* meta) {
  *meta = ToBlockMeta(n, kw.block_hashes, kw.token_ids, kw.lora_id);
  PutOptions options{.first_block_index = first_block_index,
                     .block_meta = *meta,
                     .parent_hash = ToEngineHash(kw.parent_hash, "parent_hash")};
  if (!kw.parent_fingerprint.is_none()) {
    options.parent_fingerprint = OneFingerprint(kw.parent_fingerprint, "parent_fingerprint");
  }
  return options;
}

std::vector<PutResult> PutBlocks(const PyClient& self, const Namespace& ns, py::handle fingerprints, py::handle buffers,
                                 uint32_t shard, uint32_t first_block_index, py::handle block_hashes,
                                 py::handle token_ids, py::handle lora_id, py::handle parent_hash,
                                 py::handle parent_fingerprint) {
  std::shared_ptr<Client> c = self.Get();
  const std::vector<Fingerprint> fps = ToFingerprints(fingerprints);
  BlockBuffers bufs = AcquireBlocks(buffers, fps.size(), ns.layout.ShardBytes(), /*writable=*/false);
  std::vector<std::span<const std::byte>> views(bufs.blocks.begin(), bufs.blocks.end());
  std::vector<BlockMeta> meta;
  const PutOptions options = ToPutOptions(fps.size(), first_block_index,
                                          {block_hashes, token_ids, lora_id, parent_hash, parent_fingerprint}, &meta);
  absl::StatusOr<std::vector<PutResult>> r;
  {
    py::gil_scoped_release release;
    r = c->Put(ns, fps, shard, views, options);
  }
  return ValueOrThrow(std::move(r));
}

// Raw-address segments of each block, for engines that hand out pointers into their own host pools
// (SGLang's get_page_buffer_meta): block i is the concatenation of segments [i*k, (i+1)*k).
struct Segments {
  size_t per_block = 0;
  std::vector<std::byte*> ptrs;
  std::vector<uint64_t> sizes;
  size_t staging_bytes = 0;  // n * block_bytes when blocks have several segments, else 0
};

Segments ToSegments(const py::sequence& ptrs, py::handle sizes, size_t n, uint64_t block_bytes) {
  Segments s;
  if (n == 0) return s;
  if (ptrs.size() % n != 0 || ptrs.size() == 0) {
    throw py::value_error(absl::StrCat("ptrs: ", ptrs.size(), " addresses for ", n, " blocks (want a multiple)"));
  }
  s.per_block = ptrs.size() / n;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const uint64_t addr = ToUnsigned(ptrs[i], absl::StrCat("ptrs[", i, "]"), UINTPTR_MAX);
    if (addr == 0) throw py::value_error(absl::StrCat("ptrs[", i, "]: null address"));
    s.ptrs.push_back(reinterpret_cast<std::byte*>(static_cast<uintptr_t>(addr)));
  }
  if (py::isinstance<py::int_>(sizes)) {
    s.sizes.assign(s.ptrs.size(), ToUnsigned(sizes, "sizes", block_bytes));
  } else {
    for (py::handle v : sizes) {
      s.sizes.push_back(ToUnsigned(v, absl::StrCat("sizes[", s.sizes.size(), "]"), block_bytes));
    }
    if (s.sizes.size() != s.ptrs.size()) {
      throw py::value_error(absl::StrCat("sizes: ", s.sizes.size(), " sizes for ", s.ptrs.size(), " addresses"));
    }
  }
  for (size_t b = 0; b < n; ++b) {
    // The total stays at most block_bytes, so it cannot wrap: checking only the final sum would let
    // sizes such as 2^64 - 8 and block_bytes + 8 through, and the copies below would then overrun.
    uint64_t total = 0;
    for (size_t k = 0; k < s.per_block; ++k) {
      const size_t i = b * s.per_block + k;
      if (s.sizes[i] > block_bytes - total) {
        throw py::value_error(absl::StrCat("sizes[", i, "]: the segments of block ", b, " hold more than ", block_bytes,
                                           " bytes (the namespace's block_bytes)"));
      }
      total += s.sizes[i];
    }
    if (total != block_bytes) {
      throw py::value_error(absl::StrCat("sizes: the segments of block ", b, " hold ", total, " bytes, want ",
                                         block_bytes, " (the namespace's block_bytes)"));
    }
  }
  if (s.per_block > 1 && __builtin_mul_overflow(n, block_bytes, &s.staging_bytes)) {
    throw py::value_error(
        absl::StrCat("fingerprints: ", n, " blocks of ", block_bytes, " bytes overflow the address space"));
  }
  return s;
}

std::vector<GetResult> GetPtrs(const PyClient& self, const Namespace& ns, py::handle fingerprints,
                               const py::sequence& ptrs, py::handle sizes, uint32_t shard) {
  std::shared_ptr<Client> c = self.Get();
  const std::vector<Fingerprint> fps = ToFingerprints(fingerprints);
  const uint64_t block_bytes = ns.layout.ShardBytes();
  const Segments seg = ToSegments(ptrs, sizes, fps.size(), block_bytes);
  absl::StatusOr<std::vector<GetResult>> r;
  {
    py::gil_scoped_release release;
    // One segment per block: straight into place. Several: through one staging buffer, then scattered.
    std::vector<std::byte> staging(seg.staging_bytes);
    std::vector<std::span<std::byte>> views;
    for (size_t b = 0; b < fps.size(); ++b) {
      views.emplace_back(seg.per_block == 1 ? seg.ptrs[b] : staging.data() + b * block_bytes, block_bytes);
    }
    r = c->Get(ns, fps, shard, views);
    if (r.ok() && seg.per_block > 1) {
      for (size_t b = 0; b < fps.size(); ++b) {
        if ((*r)[b] != GetResult::kHit) continue;
        const std::byte* src = views[b].data();
        for (size_t k = 0; k < seg.per_block; ++k) {
          const size_t i = b * seg.per_block + k;
          std::memcpy(seg.ptrs[i], src, seg.sizes[i]);
          src += seg.sizes[i];
        }
      }
    }
  }
  return ValueOrThrow(std::move(r));
}

std::vector<PutResult> PutPtrs(const PyClient& self, const Namespace& ns, py::handle fingerprints,
                               const py::sequence& ptrs, py::handle sizes, uint32_t shard, uint32_t first_block_index,
                               py::handle block_hashes, py::handle token_ids, py::handle lora_id,
                               py::handle parent_hash, py::handle parent_fingerprint) {
  std::shared_ptr<Client> c = self.Get();
  const std::vector<Fingerprint> fps = ToFingerprints(fingerprints);
  const uint64_t block_bytes = ns.layout.ShardBytes();
  const Segments seg = ToSegments(ptrs, sizes, fps.size(), block_bytes);
  std::vector<BlockMeta> meta;
  const PutOptions options = ToPutOptions(fps.size(), first_block_index,
                                          {block_hashes, token_ids, lora_id, parent_hash, parent_fingerprint}, &meta);
  absl::StatusOr<std::vector<PutResult>> r;
  {
    py::gil_scoped_release release;
    std::vector<std::byte> staging(seg.staging_bytes);
    std::vector<std::span<const std::byte>> views;
    for (size_t b = 0; b < fps.size(); ++b) {
      if (seg.per_block == 1) {
        views.emplace_back(seg.ptrs[b], block_bytes);
        continue;
      }
      std::byte* dst = staging.data() + b * block_bytes;
      for (size_t k = 0; k < seg.per_block; ++k) {
        const size_t i = b * seg.per_block + k;
        std::memcpy(dst, seg.ptrs[i], seg.sizes[i]);
        dst += seg.sizes[i];
      }
      views.emplace_back(staging.data() + b * block_bytes, block_bytes);
    }
    r = c->Put(ns, fps, shard, views, options);
  }
  return ValueOrThrow(std::move(r));
}

py::dict Stats(const PyClient& self) { return StatsToDict(self.Get()->stats()); }
py::list StatsInfoOf(const PyClient& self) { return StatsInfo(self.Get()->stats()); }

py::list Members(const PyClient& self) {
  py::list out;
  for (const client::MemberInfo& m : self.Get()->members()) out.append(MemberToDict(m));
  return out;
}

// Client::ServerStats as a list of dicts (see the "server_stats" docstring).
py::list ServerStatsOf(const PyClient& self, py::handle timeout) {
  std::shared_ptr<Client> c = self.Get();
  const absl::Duration t = ToDuration(timeout, "timeout");
  if (t <= absl::ZeroDuration()) throw py::value_error("timeout: must be > 0");
  std::vector<client::MemberStats> stats;
  {
    py::gil_scoped_release release;
    stats = c->ServerStats(t);
  }
  py::list out;
  for (const client::MemberStats& m : stats) {
    py::dict counters;
    py::dict kinds;
    for (const client::ServerCounter& s : m.counters) {
      counters[py::str(s.name)] = py::int_(s.value);
      kinds[py::str(s.name)] = py::str(CounterKindName(s.kind));
    }
    py::dict d;
    d["address"] = m.address;
    d["node_id"] = m.node_id;
    d["ok"] = m.status.ok();
    d["error"] = m.status.ok() ? std::string() : m.status.ToString();
    d["code"] = absl::StatusCodeToString(m.status.code());
    d["counters"] = counters;
    d["kinds"] = kinds;
    out.append(std::move(d));
  }
  return out;
}

// Makes the members of a result enum compare with ints by value (GetResult.HIT == 0, MISS > HIT), as
// enum.IntEnum members do. py::arithmetic() alone does not: for a scoped enum (enum class) pybind11's
// comparisons accept only members of the same enum. Members still hash as their value (pybind11's
// __hash__) and convert with int() and operator.index(). Unlike IntEnum members they are not ints, and
// they never equal a member of another enum (the comparison is NotImplemented, so == is False).
template <typename E>
void CompareAsInts(py::enum_<E>& cls) {
  const auto compare = [](int op) {
    return [op](E self, const py::object& other) -> py::object {
      py::object rhs;
      if (py::isinstance<E>(other)) {
        rhs = py::int_(static_cast<int>(other.cast<E>()));
      } else if (py::isinstance<py::int_>(other)) {
        rhs = other;
      } else {
        return py::reinterpret_borrow<py::object>(Py_NotImplemented);
      }
      PyObject* r = PyObject_RichCompare(py::int_(static_cast<int>(self)).ptr(), rhs.ptr(), op);
      if (r == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(r);
    };
  };
  // Assigned, not def()'d: def() would chain these after pybind11's own comparisons, which run first
  // and raise TypeError for an int.
  const std::pair<const char*, int> ops[] = {{"__eq__", Py_EQ}, {"__ne__", Py_NE}, {"__lt__", Py_LT},
                                             {"__le__", Py_LE}, {"__gt__", Py_GT}, {"__ge__", Py_GE}};
  for (const auto& [name, op] : ops) {
    cls.attr(name) = py::cpp_function(compare(op), py::name(name), py::is_method(cls), py::arg("other"));
  }
}

py::object NewException(const char* name, py::handle bases, const char* doc) {
  PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(cls);
}

}  // namespace

void RaiseStatus(const absl::Status& s) { ThrowStatus(s); }

}  // namespace kvtier::python

// PyInit__kvtier. Everything above is internal to this translation unit.
PYBIND11_MODULE(_kvtier, m) {
  using namespace kvtier;
  using namespace kvtier::python;

  m.doc() = "kvtier client binding (C++ extension). Import the `kvtier` package, not this module.";

  // Errors ------------------------------------------------------------------------------------------
  ErrorClasses& e = kvtier::python::Errors();
  e.base = NewException("kvtier.Error", PyExc_RuntimeError,
                        "A kvtier call failed. `code` is the absl/gRPC status number, `code_name` its name "
                        "(e.g. 'FAILED_PRECONDITION').");
  e.invalid_argument = NewException("kvtier.InvalidArgumentError", py::make_tuple(e.base, py::handle(PyExc_ValueError)),
                                    "A kvtier call was given a bad argument (INVALID_ARGUMENT); the message names it.");
  e.unavailable = NewException("kvtier.UnavailableError", py::make_tuple(e.base, py::handle(PyExc_ConnectionError)),
                               "No kvtier member could be reached (UNAVAILABLE); retrying the call may succeed.");
  m.attr("Error") = e.base;
  m.attr("InvalidArgumentError") = e.invalid_argument;
  m.attr("UnavailableError") = e.unavailable;

  // Enums -------------------------------------------------------------------------------------------
  // Both compare with ints by value (GetResult.HIT == 0) and convert with int(); see CompareAsInts.
  py::enum_<GetResult> get_result(m, "GetResult", "Outcome of one block of Client.get.");
  get_result.value("HIT", GetResult::kHit, "The bytes arrived and matched their checksum.")
      .value("MISS", GetResult::kMiss, "The owner does not hold the block.")
      .value("MISS_FROM_ERROR", GetResult::kMissFromError,
             "The owner failed, timed out or was unreachable (counted in stats()['misses_from_errors']).")
      .value("CHECKSUM_MISMATCH", GetResult::kChecksumMismatch,
             "Bytes arrived corrupted and were discarded; the buffer is not valid.");
  py::enum_<PutResult> put_result(m, "PutResult", "Outcome of one block of Client.put.");
  put_result.value("STORED", PutResult::kStored, "Committed by this call.")
      .value("ALREADY_PRESENT", PutResult::kAlreadyPresent, "The owner had it; its recency was refreshed.")
      .value("IN_PROGRESS", PutResult::kInProgress, "Another writer is storing it now.")
      .value("NO_SPACE", PutResult::kNoSpace, "The owner had nothing evictable.")
      .value("ERROR", PutResult::kError, "The owner failed, timed out or was unreachable (counted).");
  CompareAsInts(get_result);
  CompareAsInts(put_result);

  // KvLayout ----------------------------------------------------------------------------------------
  py::class_<KvLayout>(m, "KvLayout", R"doc(
What one stored block holds (immutable). One TP shard of a block of the standard kind is, row-major,
  [num_layers, 2 (K, V), block_tokens, num_kv_heads / tp_size, head_dim] elements of `dtype`;
the MLA kind is [num_layers, block_tokens, latent_dim]. A quantized codec stores 1-byte elements plus
fp32 scales. `block_bytes` is the exact size of every get/put buffer.

KvLayout(**fields): kind ('standard' | 'mla'), dtype ('bf16' | 'fp16' | 'fp32' | 'fp8_e4m3'),
codec ('none' | 'fp8_e4m3' | 'int8'), num_layers, num_kv_heads (whole model), head_dim, latent_dim,
block_tokens (default 16), tp_size (default 1), quant_group_size (default 64).
Raises InvalidArgumentError naming the first bad field.)doc")
      .def(py::init(&MakeLayout))
      .def_property_readonly("kind", [](const KvLayout& l) { return LayoutKindName(l.kind); })
      .def_property_readonly("dtype", [](const KvLayout& l) { return DTypeName(l.dtype); })
      .def_property_readonly("codec", [](const KvLayout& l) { return CodecName(l.codec); })
      .def_readonly("num_layers", &KvLayout::num_layers)
      .def_readonly("num_kv_heads", &KvLayout::num_kv_heads)
      .def_readonly("head_dim", &KvLayout::head_dim)
      .def_readonly("latent_dim", &KvLayout::latent_dim)
      .def_readonly("block_tokens", &KvLayout::block_tokens)
      .def_readonly("tp_size", &KvLayout::tp_size)
      .def_readonly("quant_group_size", &KvLayout::quant_group_size)
      .def_property_readonly("block_bytes", &KvLayout::ShardBytes, "Bytes of one TP shard of one block.")
      .def("to_dict", &LayoutToDict, "The fields as a dict (accepted back by KvLayout(**d)).")
      .def("__eq__", [](const KvLayout& a, const KvLayout& b) { return a == b; })
      .def("__hash__", [](const KvLayout& l) { return py::hash(py::str(l.DebugString())); })
      .def("__repr__", [](const KvLayout& l) { return absl::StrCat("KvLayout(", l.DebugString(), ")"); });

  // Namespace ---------------------------------------------------------------------------------------
  py::class_<Namespace>(m, "Namespace", R"doc(
The scope within which requests share KV: tenant, model, model revision and KV layout (immutable).

Namespace(tenant, model, revision=None, *, layout=None, tenant_salt=None, **layout_fields)
  tenant, model: 1..255 bytes. revision: None (absent) differs from ''.
  layout: a KvLayout or a dict of layout fields; **layout_fields are applied on top of it.
  tenant_salt: secret bytes/str mixed into every fingerprint, never sent to servers.
Raises InvalidArgumentError naming the bad field ("layout.head_dim: must be > 0").)doc")
      .def(py::init(&MakeNamespace), py::arg("tenant"), py::arg("model"), py::arg("revision") = py::none(),
           py::kw_only(), py::arg("layout") = py::none(), py::arg("tenant_salt") = py::none())
      .def_readonly("tenant", &Namespace::tenant)
      .def_readonly("model", &Namespace::model)
      .def_readonly("revision", &Namespace::revision)
      .def_readonly("layout", &Namespace::layout)
      .def_property_readonly("has_tenant_salt", [](const Namespace& n) { return n.tenant_salt.has_value(); })
      .def_property_readonly(
          "block_bytes", [](const Namespace& n) { return n.layout.ShardBytes(); },
          "Bytes of one TP shard of one block: the size of every get/put buffer.")
      .def_property_readonly(
          "block_tokens", [](const Namespace& n) { return n.layout.block_tokens; }, "Tokens per block.")
      .def_property_readonly(
          "tp_size", [](const Namespace& n) { return n.layout.tp_size; },
          "Shards per block (valid `shard` arguments are 0..tp_size-1).")
      .def_property_readonly("id", &Namespace::Id, "64-bit id, equal for equal namespaces on every machine.")
      .def(
          "canonical_bytes", [](const Namespace& n) { return py::bytes(n.CanonicalBytes()); },
          "The byte encoding that starts every fingerprint chain (docs/fingerprints.md).")
      .def("__eq__", [](const Namespace& a, const Namespace& b) { return a == b; })
      .def("__hash__", [](const Namespace& n) { return py::hash(py::int_(n.Id())); })
      .def("__repr__", [](const Namespace& n) {
        return absl::StrCat("Namespace(tenant='", n.tenant, "', model='", n.model,
                            "', revision=", n.revision.has_value() ? absl::StrCat("'", *n.revision, "'") : "None",
                            ", layout=", n.layout.DebugString(), ")");
      });

  // Functions ---------------------------------------------------------------------------------------
  m.def("fingerprints", &Fingerprints, py::arg("ns"), py::arg("tokens"), py::kw_only(), py::arg("lora") = py::none(),
        py::arg("cache_salt") = py::none(), py::arg("multimodal") = py::none(), py::arg("as_numpy") = false,
        R"doc(
Fingerprints of the full blocks of `tokens`: len(tokens) // ns.block_tokens of them (a partial last
block gets none), each 32 bytes of the SHA-256 chain of docs/fingerprints.md.

tokens: a sequence of ints or a 1-D integer array (uint32 token ids).
lora: (adapter_id, version) of a LoRA adapter (hashed into every block), or None.
cache_salt: per-request salt (str or bytes; hashed into block 0 only), or None.
multimodal: [(content_hash, offset_tokens, length_tokens), ...]: inputs whose embeddings occupy those
  prompt positions; every overlapping block carries content_hash.
Returns a list of 32-byte `bytes`, or with as_numpy=True a numpy uint8 array of shape [n, 32].
Runs without the GIL.)doc");
  m.def("external_key_fingerprints", &ExternalKeyFingerprints, py::arg("ns"), py::arg("keys"), py::kw_only(),
        py::arg("as_numpy") = false, R"doc(
Fingerprints for blocks that an engine names itself (e.g. SGLang page hashes): one per key (str or
bytes), SHA-256 over a domain tag, the namespace's canonical bytes, its tenant salt and the key. Keys
must already identify a whole prefix (a hash chain), since kvtier cannot chain them. Returns what
fingerprints() returns.)doc");

  // Client ------------------------------------------------------------------------------------------
  py::class_<PyLookupResult>(m, "LookupResult", "Result of Client.lookup_detail.")
      .def_readonly("prefix_blocks", &PyLookupResult::prefix_blocks, "Leading blocks present on every TP shard.")
      .def_readonly("prefix_tokens", &PyLookupResult::prefix_tokens, "prefix_blocks * block_tokens.")
      .def_readonly("present", &PyLookupResult::present, "Per block: present on every shard.")
      .def_readonly("blocks_from_errors", &PyLookupResult::blocks_from_errors,
                    "Blocks counted as misses because their owner failed.")
      .def("__repr__", [](const PyLookupResult& r) {
        return absl::StrCat("LookupResult(prefix_blocks=", r.prefix_blocks, ", blocks=", r.present.size(),
                            ", blocks_from_errors=", r.blocks_from_errors, ")");
      });

  RegisterClientOptions(m);
  py::class_<PyClient>(m, "Client", R"doc(
A connection to a kvtier cluster. Thread-safe: calls from many threads run concurrently, each without
the GIL while it waits on the network. A dead or slow member turns into misses within rpc_timeout,
never a hang; such misses are counted in stats()['misses_from_errors'].

Client(members=None, *, options=None, **fields)
  members: ["host:port" or "node_id=host:port", ...] or one comma-separated str (may be omitted with
    members_dns).
  options: a kvtier.ClientOptions to start from; members and **fields apply on top of it.
  fields: any ClientOptions field (ClientOptions.FIELDS): membership (members_dns, dns_server, health
    checks), timeouts, transport ("auto" | "grpc" | "ucx"), TLS (tls_ca_file, tls_cert_file, tls_key_file,
    tls_server_name), auth_token, replication. Durations are seconds or datetime.timedelta, or `<name>_ms`
    in milliseconds (rpc_timeout_ms=2000).
Raises TypeError (unknown option, wrong type), InvalidArgumentError (a bad value, naming the field) or
UnavailableError (no member reachable).
Use as a context manager, or call close().)doc")
      .def(py::init(&Connect), py::arg("members") = py::none(), py::kw_only(), py::arg("options") = py::none())
      .def_property_readonly(
          "options", [](const PyClient& self) { return self.options(); },
          "The ClientOptions this client was connected with (a copy).")
      .def(
          "fingerprints",
          [](const PyClient&, const Namespace& ns, py::handle tokens, py::object lora, py::object cache_salt,
             py::object multimodal, bool as_numpy) {
            return Fingerprints(ns, tokens, std::move(lora), std::move(cache_salt), std::move(multimodal), as_numpy);
          },
          py::arg("ns"), py::arg("tokens"), py::kw_only(), py::arg("lora") = py::none(),
          py::arg("cache_salt") = py::none(), py::arg("multimodal") = py::none(), py::arg("as_numpy") = false,
          "Same as kvtier.fingerprints().")
      .def(
          "lookup",
          [](const PyClient& self, const Namespace& ns, py::handle fps) {
            return LookupDetail(self, ns, fps).prefix_blocks;
          },
          py::arg("ns"), py::arg("fingerprints"), R"doc(
How many leading blocks of `fingerprints` (a chain of `ns`) the cluster holds on every TP shard. The
engine may reuse lookup(...) * ns.block_tokens tokens (subject to its own cap, e.g. len(prompt) - 1).
fingerprints: a list of 32-byte values, or a uint8 [n, 32] array. No lease is taken.
A dead or slow member counts as misses; a member's refusal of the request raises (see get()).)doc")
      .def("lookup_detail", &LookupDetail, py::arg("ns"), py::arg("fingerprints"),
           "Like lookup(), with per-block presence and the count of blocks lost to errors.")
      .def("get", &GetBlocks, py::arg("ns"), py::arg("fingerprints"), py::arg("buffers"), py::arg("shard") = 0,
           R"doc(
Fetches TP shard `shard` of each block into caller memory; returns one GetResult per block. Only HIT
buffers hold valid bytes afterwards.

buffers: a list of n writable, C-contiguous host buffers of exactly ns.block_bytes each (numpy arrays,
  bytearray, memoryview, or DLPack objects such as CPU torch tensors), or one such buffer of
  n * ns.block_bytes bytes, e.g. a numpy array of shape [n, num_layers, 2, block_tokens,
  num_kv_heads // tp_size, head_dim] (bf16 may be held as uint16).
Raises InvalidArgumentError / ValueError on size or count mismatches, BufferError for read-only or
non-contiguous buffers, ValueError for GPU memory. A dead or slow member never raises (its blocks are
MISS_FROM_ERROR); a member's refusal of the request raises with its code and message, naming the member:
InvalidArgumentError (e.g. blocks above that server's limits.max_block_bytes), or kvtier.Error with
code_name PERMISSION_DENIED / UNAUTHENTICATED.)doc")
      .def("put", &PutBlocks, py::arg("ns"), py::arg("fingerprints"), py::arg("buffers"), py::arg("shard") = 0,
           py::arg("first_block_index") = 0, py::kw_only(), py::arg("block_hashes") = py::none(),
           py::arg("token_ids") = py::none(), py::arg("lora_id") = py::none(), py::arg("parent_hash") = py::none(),
           py::arg("parent_fingerprint") = py::none(),
           R"doc(
Stores TP shard `shard` of each block from caller memory (buffers as for get(), read-only allowed);
returns one PutResult per block. first_block_index: index of fingerprints[0] in its prompt's chain (the
hit length when storing the blocks after a hit); eviction policies use it.
The engine's block metadata, published in KV events for routers (docs/events.md, "Engine block
metadata"), all optional: block_hashes (the engine's hash of each block: an int in [-2**63, 2**64) or
bytes of 1..64), token_ids (each block's token ids, at most 1024 per block), lora_id (an int for every
block) and parent_hash (the engine hash of the block before fingerprints[0]); each block's parent is
the previous block. parent_fingerprint: the kvtier fingerprint of the block before fingerprints[0]
(32 bytes or 64 hex characters), published as the first block's parent; the others' parents are the
previous fingerprints, always sent. Wrong counts raise ValueError; past the limits, InvalidArgumentError. A dead or slow member never
raises (its blocks are ERROR); a member's refusal raises as for get(), and blocks other members stored in
the same call stay stored.)doc")
      .def("get_ptrs", &GetPtrs, py::arg("ns"), py::arg("fingerprints"), py::arg("ptrs"), py::arg("sizes"),
           py::arg("shard") = 0, R"doc(
get() into raw host addresses (ints), for engines whose pools hand out pointers (SGLang's
get_page_buffer_meta). Block i is the concatenation of segments ptrs[i*k:(i+1)*k] with byte sizes
sizes[i*k:(i+1)*k] (or one int for all), k = len(ptrs) // len(fingerprints); each block's segments
must sum to ns.block_bytes. One segment per block is written in place; several are filled from a
staging copy. The addresses must stay valid and unaliased for the call: nothing can check them.)doc")
      .def("put_ptrs", &PutPtrs, py::arg("ns"), py::arg("fingerprints"), py::arg("ptrs"), py::arg("sizes"),
           py::arg("shard") = 0, py::arg("first_block_index") = 0, py::kw_only(), py::arg("block_hashes") = py::none(),
           py::arg("token_ids") = py::none(), py::arg("lora_id") = py::none(), py::arg("parent_hash") = py::none(),
           py::arg("parent_fingerprint") = py::none(),
           "put() from raw host addresses (see get_ptrs), with put()'s engine block metadata keywords.")
      .def("stats", &Stats, R"doc(
Every counter of this client's ClientStats (kvtier/client/client.h documents each), as a dict of ints:
hit accounting (lookups, lookup_blocks, prefix_hit_blocks, prefix_hit_tokens, get_blocks,
retrieve_hit_blocks, retrieve_hit_tokens, retrieve_hit_bytes, put_blocks, put_stored_blocks,
put_stored_bytes, put_rejected_blocks), failures (misses_from_errors, rpc_errors, checksum_failures),
UCX (ucx_get_blocks, ucx_lane_get_blocks, ucx_leases, ucx_put_blocks, ucx_endpoint_failures,
ucx_connects, ucx_allocates, ucx_commits), NCCL (nccl_get_blocks), membership (ring_changes, dns_resolutions, dns_failures, health_check_failures,
members_ejected) and replication (replica_puts, replica_put_failures, hints_queued, hints_delivered,
hints_dropped, replica_read_blocks). The keys come from ClientStats::ForEach, so a counter added there
appears here too.)doc")
      .def("stats_info", &StatsInfoOf, R"doc(
Every counter of stats() with its description: a list of dicts {name, value, help, kind} in the C++
list's order (kind is 'counter' for all of them), e.g. to export them to a metrics system.)doc")
      .def("server_stats", &ServerStatsOf, py::arg("timeout") = 5.0, R"doc(
Every member's server counters now, as its admin GetStats RPC answers them (the samples its /metrics
serves: store, tiers, leases, quotas, UCX, events and every other component's), asked of all members
at once, each within `timeout` (seconds or datetime.timedelta). A list, one dict per member in
members() order: address, node_id, ok (bool), code ('OK', 'UNAVAILABLE', 'PERMISSION_DENIED' for a
worker token: GetStats is an admin RPC, ...), error ('' when ok), counters {sample name: int}, e.g.
'kvtier_lookup_blocks_total{result="hit"}', and kinds {sample name: 'counter' | 'gauge'}. Never
raises for a member that does not answer: its entry says why.)doc")
      .def("members", &Members, R"doc(
Every member as this client sees it, static ones first: dicts with node_id ('' until it answered),
address, from_dns, in_ring, health ('unknown' | 'healthy' | 'ejected'), consecutive_failures,
last_health_error and transport (this member's data path now: 'ucx', 'grpc', or 'none' with transport
'ucx' and no working endpoint).)doc")
      .def(
          "flush_replicas",
          [](const PyClient& self, py::handle timeout) {
            std::shared_ptr<Client> c = self.Get();
            const absl::Duration t = ToDuration(timeout, "timeout");
            absl::Status st;
            {
              py::gil_scoped_release release;
              st = c->FlushReplicas(t);
            }
            OkOrThrow(st);
          },
          py::arg("timeout") = 10.0, R"doc(
Waits until the background replica queue is empty (hinted blocks waiting for their owner do not count),
for at most `timeout` (seconds or datetime.timedelta). Raises kvtier.Error (DEADLINE_EXCEEDED).)doc")
      .def("close", &PyClient::Close, "Closes the channels. Later calls raise kvtier.Error (FAILED_PRECONDITION).")
      .def_property_readonly("closed", &PyClient::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& self, py::args) {
        self.Close();
        return false;
      });

  RegisterEventSubscriber(m);
  RegisterSimilarity(m);
}
