// What the translation units of kvtier._kvtier share: module.cc (errors, namespaces, fingerprints, the
// Client) and the parts that define further classes (options.cc: ClientOptions and the dicts of stats
// and members; events.cc: EventSubscriber; similarity.cc: MinHasher and friends). Each part has one
// Register* function that PYBIND11_MODULE (module.cc) calls; everything else of a part is private to it.
#ifndef KVTIER_BINDINGS_PYTHON_MODULE_PARTS_H_
#define KVTIER_BINDINGS_PYTHON_MODULE_PARTS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/client/event_subscriber.h"
#include "kvtier/common/fingerprint.h"

namespace kvtier::python {

namespace py = pybind11;

// ---- Defined in module.cc ----------------------------------------------------------------------------

// Raises `s` (not OK) as the kvtier.Error subclass of its code (InvalidArgumentError for
// INVALID_ARGUMENT, which is also a ValueError). Call with the GIL held.
[[noreturn]] void RaiseStatus(const absl::Status& s);

// Token ids from a sequence of ints or a 1-D integer array. Raises TypeError / ValueError naming the
// bad element.
std::vector<uint32_t> ToTokens(py::handle tokens);

// Fingerprints from a list of 32-byte values (or 64-character hex strings) or one buffer of 32 * n
// bytes. Raises TypeError / ValueError naming the bad element.
std::vector<Fingerprint> ToFingerprints(py::handle fps);

// ---- options.cc ---------------------------------------------------------------------------------------

// Defines kvtier.ClientOptions and kvtier.ReplicationOverride.
void RegisterClientOptions(py::module_& m);

// The ClientOptions of `base` (None: the defaults) with `members` (None: keep; a list of "host:port" or
// one comma-separated str) and the keyword arguments `fields` applied, then validated. Keywords are the
// ClientOptions field names, plus `<name>_ms` (milliseconds) for each duration field.
// Raises TypeError (an unknown keyword, a value of the wrong type) or kvtier.InvalidArgumentError (a
// ValueError: a bad value; the message names the field).
client::ClientOptions ClientOptionsFromPython(py::handle base, py::handle members, const py::dict& fields);

// A duration given as seconds (int or float) or a datetime.timedelta. Raises TypeError / ValueError
// naming `field`.
absl::Duration ToDuration(py::handle value, const std::string& field);

// The same for EventSubscriberOptions (no base). Not validated here (EventSubscriber::Start does).
client::EventSubscriberOptions EventSubscriberOptionsFromPython(py::handle members, const py::dict& fields);

// Every counter of ClientStats / EventSubscriberStats as a dict of ints, in list order.
py::dict StatsToDict(const client::ClientStats& stats);
// Every counter of ClientStats (ClientStats::ForEach) as a list of dicts {name, value, help, kind}.
py::list StatsInfo(const client::ClientStats& stats);
py::dict StatsToDict(const client::EventSubscriberStats& stats);

// Every field of a MemberInfo as a dict (health as "unknown" | "healthy" | "ejected").
py::dict MemberToDict(const client::MemberInfo& member);

// ---- events.cc / similarity.cc -------------------------------------------------------------------------

// Defines kvtier.EventSubscriber.
void RegisterEventSubscriber(py::module_& m);

// Defines kvtier.MinHasher, kvtier.LshBands, kvtier.SimilarityIndex and the similarity functions.
void RegisterSimilarity(py::module_& m);

}  // namespace kvtier::python

#endif  // KVTIER_BINDINGS_PYTHON_MODULE_PARTS_H_
