// Compiles the checks of kvtier/client/field_lists.h into client_lib itself, so that a field added to
// ClientOptions, EventSubscriberOptions or a stats struct without its list fails this library's build,
// whether or not the bindings are built.
#include "kvtier/client/field_lists.h"
