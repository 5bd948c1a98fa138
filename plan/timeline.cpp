// The op kinds' tokens live in the header (kOpKindTokens); this unit checks that it compiles alone.
#include "plan/timeline.h"
