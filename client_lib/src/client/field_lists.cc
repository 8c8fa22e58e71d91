// Compiles the checks of kvtier/client/field_lists.h into client_lib itself, so that a field added to
// ClientOptions, EventSubscriberOptions or a stats struct without its list fails this library's build,
// whether or not the bindings are built.
#include "kvtier/client/field_lists.h"

namespace kvtier::client {

void ClientStats::ForEach(const CounterVisitor& visit) const {
#define KVTIER_CLIENT_STATS_VISIT_(field, text)                                   \
  visit(CounterInfo{.name = #field, .help = text, .kind = CounterKind::kCounter}, \
        field.load(std::memory_order_relaxed));
  KVTIER_CLIENT_STATS_COUNTERS(KVTIER_CLIENT_STATS_VISIT_)
#undef KVTIER_CLIENT_STATS_VISIT_
}

}  // namespace kvtier::client
