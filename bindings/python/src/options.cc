// kvtier.ClientOptions and kvtier.ReplicationOverride, and the dicts of stats and members, built from the
// field lists of kvtier/client/field_lists.h: every field of ClientOptions is a keyword here because the
// code below visits the list (ForEachField) and converts by the field's C++ type, so a new field needs
// no change in this file unless it has a type never seen before (which then fails to compile).
//
// Python values: strings are str (or os.PathLike); a list of strings is a list/tuple of str or one
// comma-separated str; durations are seconds (int or float) or datetime.timedelta, and `<name>_ms`
// takes milliseconds; integers are int (or anything with __index__, never bool). None leaves a field at
// its default (or at the base options' value).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "kvtier/client/field_lists.h"
#include "kvtier/common/aggregate_fields.h"
#include "module_parts.h"

namespace kvtier::python {
namespace {

using client::ClientOptions;
using client::EventSubscriberOptions;
using Override = ClientOptions::ReplicationOverride;

std::string TypeName(py::handle v) { return py::str(py::type::handle_of(v).attr("__name__")); }

[[noreturn]] void BadValue(const std::string& field, const std::string& why) {
  RaiseStatus(absl::InvalidArgumentError(absl::StrCat(field, ": ", why)));
}

[[noreturn]] void WrongType(const std::string& field, const char* want, py::handle v) {
  throw py::type_error(absl::StrCat(field, ": must be ", want, ", got ", TypeName(v)));
}

// ---- Python -> C++, by field type ---------------------------------------------------------------------

// An int (or an object with __index__, e.g. a numpy integer; never a bool) in [lo, hi].
template <typename T>
T ToInteger(py::handle v, const std::string& field) {
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr())) WrongType(field, "an int", v);
  const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  const std::string text = py::str(i);
  if (overflow < 0 || (overflow == 0 && x < static_cast<long long>(std::numeric_limits<T>::min()))) {
    if constexpr (std::is_signed_v<T>) {
      BadValue(field, absl::StrCat(text, " is below the limit of ", std::numeric_limits<T>::min()));
    } else {
      BadValue(field, absl::StrCat(text, " is negative"));
    }
  }
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
    if (PyErr_Occurred() || u > static_cast<unsigned long long>(std::numeric_limits<T>::max())) {
      PyErr_Clear();
      BadValue(field, absl::StrCat(text, " is above the limit of ", std::numeric_limits<T>::max()));
    }
    return static_cast<T>(u);
  }
  if (x >= 0 && static_cast<unsigned long long>(x) > static_cast<unsigned long long>(std::numeric_limits<T>::max())) {
    BadValue(field, absl::StrCat(text, " is above the limit of ", std::numeric_limits<T>::max()));
  }
  return static_cast<T>(x);
}

void Assign(uint32_t& f, py::handle v, const std::string& field) { f = ToInteger<uint32_t>(v, field); }
void Assign(uint64_t& f, py::handle v, const std::string& field) { f = ToInteger<uint64_t>(v, field); }
void Assign(int& f, py::handle v, const std::string& field) { f = ToInteger<int>(v, field); }

void Assign(std::string& f, py::handle v, const std::string& field) {
  if (py::isinstance<py::str>(v)) {
    f = v.cast<std::string>();
    return;
  }
  if (py::hasattr(v, "__fspath__")) {  // pathlib.Path and other os.PathLike objects
    py::object path = py::module_::import("os").attr("fspath")(v);
    if (py::isinstance<py::str>(path)) {
      f = path.cast<std::string>();
      return;
    }
  }
  WrongType(field, "a str", v);
}

void Assign(std::vector<std::string>& f, py::handle v, const std::string& field) {
  std::vector<std::string> out;
  if (py::isinstance<py::str>(v)) {  // "h:p,h:p"
    for (absl::string_view piece : absl::StrSplit(v.cast<std::string>(), ',')) {
      std::string item(piece);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (!item.empty()) out.push_back(std::move(item));
    }
  } else if (py::isinstance<py::bytes>(v) || !py::isinstance<py::iterable>(v)) {
    WrongType(field, "a list of str or one comma-separated str", v);
  } else {
    for (py::handle item : v) {
      const std::string what = absl::StrCat(field, "[", out.size(), "]");
      std::string s;
      Assign(s, item, what);
      out.push_back(std::move(s));
    }
  }
  f = std::move(out);
}

// Seconds (int or float) or a datetime.timedelta.
void Assign(absl::Duration& f, py::handle v, const std::string& field) {
  static const py::handle timedelta = py::object(py::module_::import("datetime").attr("timedelta")).release();
  if (py::isinstance(v, timedelta)) {  // exact: days, seconds and microseconds are ints
    f = absl::Hours(24 * v.attr("days").cast<int64_t>()) + absl::Seconds(v.attr("seconds").cast<int64_t>()) +
        absl::Microseconds(v.attr("microseconds").cast<int64_t>());
    return;
  }
  if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v))) {
    WrongType(field, "seconds (int or float) or a datetime.timedelta", v);
  }
  const double s = v.cast<double>();
  if (!std::isfinite(s)) BadValue(field, absl::StrCat(s, " seconds is not a finite duration"));
  f = absl::Seconds(s);
}

// `<name>_ms`: milliseconds (int or float).
void AssignMilliseconds(absl::Duration& f, py::handle v, const std::string& field) {
  if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v))) {
    WrongType(field, "milliseconds (int or float)", v);
  }
  const double ms = v.cast<double>();
  if (!std::isfinite(ms)) BadValue(field, absl::StrCat(ms, " ms is not a finite duration"));
  f = absl::Milliseconds(ms);
}

template <typename Options>
void ApplyFields(Options& o, const py::dict& fields, const std::string& prefix);

Override ToOverride(py::handle v, const std::string& field) {
  if (py::isinstance<Override>(v)) return v.cast<Override>();
  Override r;
  if (py::isinstance<py::dict>(v)) {
    ApplyFields(r, v.cast<py::dict>(), field + ".");
    return r;
  }
  if (py::isinstance<py::tuple>(v) || py::isinstance<py::list>(v)) {  // (tenant[, model[, replication_factor]])
    py::sequence s = py::reinterpret_borrow<py::sequence>(v);
    if (s.size() < 1 || s.size() > 3) {
      BadValue(field, absl::StrCat("a tuple of ", s.size(), " items; want (tenant, model, replication_factor)"));
    }
    Assign(r.tenant, s[0], field + ".tenant");
    if (s.size() > 1) Assign(r.model, s[1], field + ".model");
    if (s.size() > 2) Assign(r.replication_factor, s[2], field + ".replication_factor");
    return r;
  }
  WrongType(field, "a kvtier.ReplicationOverride, a dict or a (tenant, model, replication_factor) tuple", v);
}

void Assign(std::vector<Override>& f, py::handle v, const std::string& field) {
  if (py::isinstance<py::str>(v) || py::isinstance<py::dict>(v) || !py::isinstance<py::iterable>(v)) {
    WrongType(field, "a list of replication overrides", v);
  }
  std::vector<Override> out;
  for (py::handle item : v) out.push_back(ToOverride(item, absl::StrCat(field, "[", out.size(), "]")));
  f = std::move(out);
}

// The keywords of `Options`, in list order: each field's name, and `<name>_ms` after each duration.
template <typename Options>
std::vector<std::string> Keywords() {
  std::vector<std::string> out;
  Options o;
  client::ForEachField(o, [&](const char* name, auto& field) {
    out.emplace_back(name);
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, absl::Duration>) {
      out.push_back(absl::StrCat(name, "_ms"));
    }
  });
  return out;
}

// Applies `fields` (keyword -> value; None = leave the field as it is) to `o`. `prefix` starts every
// field name in messages: "" or a path ending in "." ("replication_overrides[0].").
template <typename Options>
void ApplyFields(Options& o, const py::dict& fields, const std::string& prefix) {
  std::set<std::string> given;  // field names, to refuse a duration given both ways
  for (auto [k, v] : fields) {
    if (!py::isinstance<py::str>(k)) throw py::type_error("option names must be str");
    const std::string key = py::cast<std::string>(k);
    bool found = false;
    client::ForEachField(o, [&](const char* name, auto& field) {
      using Field = std::decay_t<decltype(field)>;
      const bool as_ms = std::is_same_v<Field, absl::Duration> && key == absl::StrCat(name, "_ms");
      if (found || (key != name && !as_ms)) return;
      found = true;
      const std::string what = prefix + (as_ms ? key : std::string(name));
      if (!given.insert(name).second) {
        BadValue(prefix + name, absl::StrCat("given twice (as ", name, " and ", name, "_ms)"));
      }
      if (v.is_none()) return;
      if constexpr (std::is_same_v<Field, absl::Duration>) {
        if (as_ms) {
          AssignMilliseconds(field, v, what);
          return;
        }
      }
      Assign(field, v, what);
    });
    if (!found) {
      if (prefix.empty()) {
        throw py::type_error(
            absl::StrCat("unknown option '", key, "'; the options are ", absl::StrJoin(Keywords<Options>(), ", ")));
      }
      throw py::type_error(absl::StrCat(prefix.substr(0, prefix.size() - 1), ": unknown field '", key,
                                        "'; the fields are ", absl::StrJoin(Keywords<Options>(), ", ")));
    }
  }
}

// ---- C++ -> Python ------------------------------------------------------------------------------------

py::object ToPython(const std::string& s) { return py::str(s); }
py::object ToPython(const std::vector<std::string>& v) { return py::cast(v); }
py::object ToPython(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return py::float_(std::numeric_limits<double>::infinity());
  if (d == -absl::InfiniteDuration()) return py::float_(-std::numeric_limits<double>::infinity());
  return py::float_(absl::ToDoubleSeconds(d));
}
py::object ToPython(uint32_t v) { return py::int_(v); }
py::object ToPython(uint64_t v) { return py::int_(v); }
py::object ToPython(int v) { return py::int_(v); }
py::dict ToDict(const Override& r) {
  py::dict d;
  client::ForEachField(r, [&](const char* name, const auto& field) { d[name] = ToPython(field); });
  return d;
}
py::object ToPython(const std::vector<Override>& v) {
  py::list out;
  for (const Override& r : v) out.append(ToDict(r));
  return out;
}

template <typename Options>
py::dict ToDict(const Options& o) {
  py::dict d;
  client::ForEachField(o, [&](const char* name, const auto& field) { d[name] = ToPython(field); });
  return d;
}

template <typename Options>
py::object FieldToPython(const Options& o, const std::string& key) {
  py::object out;
  client::ForEachField(o, [&](const char* name, const auto& field) {
    if (key == name) out = ToPython(field);
  });
  return out;
}

// "ClientOptions(members=['a:1'], transport='ucx')": the fields that differ from the defaults, with the
// token (a secret) shown as '<redacted>'.
template <typename Options>
std::string Repr(const char* type, const Options& o) {
  py::dict mine = ToDict(o);
  py::dict defaults = ToDict(Options{});
  std::vector<std::string> parts;
  for (auto [k, v] : mine) {
    if (v.equal(defaults[k])) continue;
    const std::string key = py::str(k);
    parts.push_back(absl::StrCat(key, "=", key == "auth_token" ? "'<redacted>'" : std::string(py::repr(v))));
  }
  return absl::StrCat(type, "(", absl::StrJoin(parts, ", "), ")");
}

py::tuple FieldNames(const std::vector<std::string>& keywords) {
  py::list out;
  for (const std::string& k : keywords) {
    if (!absl::EndsWith(k, "_ms")) out.append(k);
  }
  return py::tuple(out);
}

const char* HealthName(client::MemberHealth h) {
  switch (h) {
    case client::MemberHealth::kUnknown:
      return "unknown";
    case client::MemberHealth::kHealthy:
      return "healthy";
    case client::MemberHealth::kEjected:
      return "ejected";
  }
  return "unknown";
}

constexpr const char* kClientOptionsDoc = R"doc(
Every option of the C++ client (kvtier/client/client.h, docs/config.md "Client options"), validated.

ClientOptions(members=None, **options)
  members: ["host:port" or "node_id=host:port", ...] or one comma-separated str.
  options: every ClientOptions field by its C++ name (ClientOptions.FIELDS lists them): members_dns,
    dns_server, dns_refresh_interval, ..., transport, tls_ca_file, ..., auth_token, replication_factor,
    replication_overrides, ... Durations are seconds (int or float) or datetime.timedelta; each duration
    `x` also takes `x_ms` in milliseconds (not both). replication_overrides: a list of
    kvtier.ReplicationOverride, dicts {"tenant", "model", "replication_factor"} or
    (tenant, model, replication_factor) tuples. None leaves a field at its default.
Raises TypeError (unknown option, wrong type) or kvtier.InvalidArgumentError (a ValueError: a bad
value; the message starts with the field's name).
Attributes read each field (durations as float seconds, overrides as dicts); to_dict() gives them all,
and ClientOptions(**options.to_dict()) is an equal copy. repr() shows the fields that differ from the
defaults, never the token.)doc";

}  // namespace

client::ClientOptions ClientOptionsFromPython(py::handle base, py::handle members, const py::dict& fields) {
  ClientOptions o;
  if (!base.is_none()) {
    if (!py::isinstance<ClientOptions>(base)) WrongType("options", "a kvtier.ClientOptions", base);
    o = base.cast<ClientOptions>();
  }
  if (!members.is_none()) Assign(o.members, members, "members");
  ApplyFields(o, fields, "");
  if (absl::Status s = o.Validate(); !s.ok()) RaiseStatus(s);
  return o;
}

absl::Duration ToDuration(py::handle value, const std::string& field) {
  absl::Duration d;
  Assign(d, value, field);
  return d;
}

client::EventSubscriberOptions EventSubscriberOptionsFromPython(py::handle members, const py::dict& fields) {
  EventSubscriberOptions o;
  if (!members.is_none()) Assign(o.members, members, "members");
  ApplyFields(o, fields, "");
  return o;
}

py::dict StatsToDict(const client::ClientStats& stats) {
  py::dict d;
  stats.ForEach([&](const CounterInfo& info, uint64_t v) { d[py::str(info.name.data(), info.name.size())] = v; });
  return d;
}

py::list StatsInfo(const client::ClientStats& stats) {
  py::list out;
  stats.ForEach([&](const CounterInfo& info, uint64_t v) {
    py::dict d;
    d["name"] = py::str(info.name.data(), info.name.size());
    d["value"] = v;
    d["help"] = py::str(info.help.data(), info.help.size());
    d["kind"] = CounterKindName(info.kind);
    out.append(std::move(d));
  });
  return out;
}

py::dict StatsToDict(const client::EventSubscriberStats& stats) {
  py::dict d;
  client::ForEachCounter(stats, [&](const char* name, uint64_t v) { d[name] = v; });
  return d;
}

py::dict MemberToDict(const client::MemberInfo& m) {
  static_assert(AggregateFieldCount<client::MemberInfo>() == 8, "MemberInfo changed: update MemberToDict");
  py::dict d;
  d["node_id"] = m.node_id;
  d["address"] = m.address;
  d["from_dns"] = m.from_dns;
  d["in_ring"] = m.in_ring;
  d["health"] = HealthName(m.health);
  d["consecutive_failures"] = m.consecutive_failures;
  d["last_health_error"] = m.last_health_error;
  d["transport"] = m.transport;
  return d;
}

void RegisterClientOptions(py::module_& m) {
  py::class_<Override>(m, "ReplicationOverride", R"doc(
A per-namespace replication factor (ClientOptions.replication_overrides): the first entry whose tenant
equals the namespace's tenant and whose model is equal or "" (every model of that tenant) wins.

ReplicationOverride(tenant, model="", replication_factor=1); ClientOptions checks the values
(tenant not empty, replication_factor in 1..16).)doc")
      .def(py::init([](py::handle tenant, py::handle model, py::handle replication_factor) {
             Override r;
             Assign(r.tenant, tenant, "tenant");
             Assign(r.model, model, "model");
             Assign(r.replication_factor, replication_factor, "replication_factor");
             return r;
           }),
           py::arg("tenant"), py::arg("model") = "", py::arg("replication_factor") = 1)
      .def_readonly("tenant", &Override::tenant)
      .def_readonly("model", &Override::model)
      .def_readonly("replication_factor", &Override::replication_factor)
      .def("to_dict", [](const Override& r) { return ToDict(r); })
      .def("__eq__", [](const Override& a, const Override& b) { return ToDict(a).equal(ToDict(b)); })
      .def("__repr__", [](const Override& r) {
        return absl::StrCat("ReplicationOverride(tenant=", std::string(py::repr(py::str(r.tenant))),
                            ", model=", std::string(py::repr(py::str(r.model))),
                            ", replication_factor=", r.replication_factor, ")");
      });

  py::class_<ClientOptions> cls(m, "ClientOptions", kClientOptionsDoc);
  cls.def(py::init([](py::object members, py::kwargs kwargs) {
            return ClientOptionsFromPython(py::none(), members, kwargs);
          }),
          py::arg("members") = py::none())
      .def(
          "to_dict", [](const ClientOptions& o) { return ToDict(o); },
          "Every field by name: str, int, float seconds, a list of str, or a list of dicts (overrides).")
      .def("__eq__", [](const ClientOptions& a, const ClientOptions& b) { return ToDict(a).equal(ToDict(b)); })
      .def("__repr__", [](const ClientOptions& o) { return Repr("ClientOptions", o); })
      .def(py::pickle([](const ClientOptions& o) { return ToDict(o); },
                      [](const py::dict& d) { return ClientOptionsFromPython(py::none(), py::none(), d); }));
  const std::vector<std::string> keywords = Keywords<ClientOptions>();
  for (const std::string& name : keywords) {
    if (absl::EndsWith(name, "_ms")) continue;
    cls.def_property_readonly(name.c_str(), [name](const ClientOptions& o) { return FieldToPython(o, name); });
  }
  cls.attr("FIELDS") = FieldNames(keywords);
  cls.attr("KEYWORDS") = py::module_::import("builtins").attr("frozenset")(py::cast(keywords));
  // The keywords of EventSubscriber(...), for documentation and the adapters.
  m.attr("EVENT_SUBSCRIBER_OPTIONS") = py::cast(Keywords<EventSubscriberOptions>());
}

}  // namespace kvtier::python
