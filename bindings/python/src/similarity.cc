// kvtier.MinHasher, kvtier.LshBands, kvtier.SimilarityIndex and the similarity functions: the similarity
// groups of kvtier/common/similarity.h (DESIGN.md §7), for routers and reports in Python. The values
// are the C++ ones bit for bit (the same code), so a key computed here equals the group_key a server
// reports for the same prompt (kvtierctl groups). Hashing runs without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/common/similarity.h"
#include "module_parts.h"

namespace kvtier::python {
namespace {

// 64-bit items: a 1-D array of 8-byte integers (numpy uint64 / int64; negative values refused) or a
// sequence of ints in [0, 2^64).
std::vector<uint64_t> ToItems(py::handle items, const char* what) {
  std::vector<uint64_t> out;
  if (PyObject_CheckBuffer(items.ptr()) && !py::isinstance<py::bytes>(items) && !py::isinstance<py::bytearray>(items)) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(items).request();
    const std::string fmt = info.format;
    const char f = fmt.empty() ? '?' : fmt.back();
    const bool is_signed = f == 'q' || f == 'l';
    if (info.ndim != 1 || info.itemsize != 8 || !(is_signed || f == 'Q' || f == 'L')) {
      throw py::type_error(absl::StrCat(what, ": an array must be 1-D of 8-byte integers, got format '", fmt, "' with ",
                                        info.ndim, " dimension(s)"));
    }
    out.resize(static_cast<size_t>(info.shape[0]));
    const auto* base = static_cast<const char*>(info.ptr);
    for (size_t i = 0; i < out.size(); ++i) {
      std::memcpy(&out[i], base + static_cast<py::ssize_t>(i) * info.strides[0], 8);
      if (is_signed && static_cast<int64_t>(out[i]) < 0) {
        throw py::value_error(absl::StrCat(what, "[", i, "]: ", static_cast<int64_t>(out[i]), " is negative"));
      }
    }
    return out;
  }
  if (py::isinstance<py::str>(items) || !py::isinstance<py::iterable>(items)) {
    throw py::type_error(absl::StrCat(what, ": must be a sequence of ints or a 1-D array of 8-byte integers"));
  }
  for (py::handle v : items) {
    if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr())) {
      throw py::type_error(absl::StrCat(what, "[", out.size(), "]: must be an int"));
    }
    const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!i) throw py::error_already_set();
    const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw py::value_error(
          absl::StrCat(what, "[", out.size(), "]: ", std::string(py::str(i)), " is not in [0, 2^64)"));
    }
    out.push_back(u);
  }
  return out;
}

MinHasher MakeHasher(double threshold, uint32_t num_hashes, uint32_t shingle_size, uint64_t seed) {
  auto h =
      MinHasher::Create({.threshold = threshold, .num_hashes = num_hashes, .shingle_size = shingle_size, .seed = seed});
  if (!h.ok()) RaiseStatus(h.status());
  return std::move(h).value();
}

}  // namespace

void RegisterSimilarity(py::module_& m) {
  py::class_<LshBands>(m, "LshBands", R"doc(
An LSH banding of a MinHash signature: `bands` bands of `rows` rows. Two sets of Jaccard index s share
at least one band with probability 1 - (1 - s**rows)**bands.)doc")
      .def(py::init([](uint32_t bands, uint32_t rows) { return LshBands{.bands = bands, .rows = rows}; }),
           py::arg("bands"), py::arg("rows"))
      .def_readonly("bands", &LshBands::bands)
      .def_readonly("rows", &LshBands::rows)
      .def("collision_probability", &LshBands::CollisionProbability, py::arg("s"),
           "P(s) = 1 - (1 - s^rows)^bands for a Jaccard index s in [0, 1].")
      .def("approximate_threshold", &LshBands::ApproximateThreshold, "(1/bands)^(1/rows): near the steepest P(s).")
      .def("__eq__", [](const LshBands& a, const LshBands& b) { return a.bands == b.bands && a.rows == b.rows; })
      .def("__repr__",
           [](const LshBands& b) { return absl::StrCat("LshBands(bands=", b.bands, ", rows=", b.rows, ")"); });

  m.def(
      "choose_lsh_bands",
      [](double threshold, uint32_t num_hashes) {
        auto b = ChooseLshBands(threshold, num_hashes);
        if (!b.ok()) RaiseStatus(b.status());
        return *b;
      },
      py::arg("threshold") = 0.85, py::arg("num_hashes") = 128, R"doc(
The banding with bands * rows <= num_hashes that minimises the false positive plus false negative area
around `threshold` (kvtier/common/similarity.h). Raises InvalidArgumentError for a threshold outside
(0, 1) or num_hashes outside 1..4096.)doc");

  py::class_<MinHasher>(m, "MinHasher", R"doc(
MinHash signatures, LSH band keys and affinity keys of item sequences (DESIGN.md §7). Items are 64-bit
ints: items_from_fingerprints(fps) (the usual input, with shingle_size 1), items_from_tokens(tokens)
(with shingle_size 4 to 16), or any ids. Deterministic across processes and machines; every party that
compares keys must use the same options. Keys are never 0.

MinHasher(*, threshold=0.85, num_hashes=128, shingle_size=1, seed=0); raises InvalidArgumentError
naming a bad option.)doc")
      .def(py::init(&MakeHasher), py::kw_only(), py::arg("threshold") = 0.85, py::arg("num_hashes") = 128,
           py::arg("shingle_size") = 1, py::arg("seed") = 0)
      .def_property_readonly("threshold", [](const MinHasher& h) { return h.options().threshold; })
      .def_property_readonly("num_hashes", &MinHasher::num_hashes)
      .def_property_readonly("shingle_size", [](const MinHasher& h) { return h.options().shingle_size; })
      .def_property_readonly("seed", [](const MinHasher& h) { return h.options().seed; })
      .def_property_readonly("bands", &MinHasher::bands, "The LshBands chosen for threshold and num_hashes.")
      .def(
          "signature",
          [](const MinHasher& h, py::handle items) {
            const std::vector<uint64_t> v = ToItems(items, "items");
            py::gil_scoped_release release;
            return h.Signature(v);
          },
          py::arg("items"), "num_hashes values: the minimum of each hash function over the shingles of `items`.")
      .def(
          "band_keys",
          [](const MinHasher& h, py::handle signature) {
            const std::vector<uint64_t> v = ToItems(signature, "signature");
            if (v.size() != h.num_hashes()) {
              RaiseStatus(absl::InvalidArgumentError(
                  absl::StrCat("signature: has ", v.size(), " values, want num_hashes = ", h.num_hashes())));
            }
            py::gil_scoped_release release;
            return h.BandKeys(v);
          },
          py::arg("signature"), "One key per band of a signature() (bands.bands keys).")
      .def(
          "band_keys_of",
          [](const MinHasher& h, py::handle items) {
            const std::vector<uint64_t> v = ToItems(items, "items");
            py::gil_scoped_release release;
            return h.BandKeysOf(v);
          },
          py::arg("items"), "band_keys(signature(items)).")
      .def(
          "affinity_key",
          [](const MinHasher& h, py::handle items) {
            const std::vector<uint64_t> v = ToItems(items, "items");
            py::gil_scoped_release release;
            return h.AffinityKey(v);
          },
          py::arg("items"), R"doc(
The stateless group key of `items`: band 0's key. Equal for two sets of Jaccard index s with
probability s**bands.rows.)doc");

  m.def(
      "items_from_fingerprints",
      [](py::handle fps) {
        const std::vector<Fingerprint> v = ToFingerprints(fps);
        return ItemsFromFingerprints(v);
      },
      py::arg("fingerprints"), "The item of each fingerprint: its first 8 bytes, little-endian (its ring position).");
  m.def(
      "items_from_tokens",
      [](py::handle tokens) {
        const std::vector<uint32_t> v = ToTokens(tokens);
        return ItemsFromTokens(v);
      },
      py::arg("tokens"), "Token ids widened to 64-bit items.");
  m.def(
      "prompt_group_key",
      [](py::handle fps) {
        const std::vector<Fingerprint> v = ToFingerprints(fps);
        py::gil_scoped_release release;
        return PromptGroupKey(v);
      },
      py::arg("fingerprints"), R"doc(
The group key every Client lookup sends with a prompt's fingerprints (the affinity key of the first
GROUP_KEY_BLOCKS blocks under the default MinHasher options): the key that servers count lookups and hits
under, and that `kvtierctl groups` reports. Never 0.)doc");
  m.attr("GROUP_KEY_BLOCKS") = kGroupKeyBlocks;

  py::class_<SimilarityIndex>(m, "SimilarityIndex", R"doc(
A bounded LSH table that assigns group ids (kvtier/common/similarity.h): a request joins the group of
the first of its band keys already in the table, else founds a group named by its band-0 key (so the
id equals MinHasher.affinity_key for a group's first member). At most capacity_keys band keys (>= 2),
the oldest dropped first. Deterministic. Thread-safe.

SimilarityIndex(capacity_keys=1 << 20))doc")
      .def(py::init<size_t>(), py::arg("capacity_keys") = size_t{1} << 20)
      .def(
          "assign",
          [](SimilarityIndex& index, py::handle band_keys) {
            const std::vector<uint64_t> v = ToItems(band_keys, "band_keys");
            py::gil_scoped_release release;
            return index.Assign(v);
          },
          py::arg("band_keys"), "The group of a request with these band keys (MinHasher.band_keys); 0 for none.")
      .def("__len__", &SimilarityIndex::size, "Band keys held now.");
}

}  // namespace kvtier::python
