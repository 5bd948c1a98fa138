#include "plan/timeline.h"

namespace packpipe::plan {

const char* op_kind_token(OpKind k) {
  switch (k) {
    case OpKind::Forward: return "F";
    case OpKind::Backward: return "B";
    case OpKind::BackwardInput: return "I";
    case OpKind::BackwardWeight: return "W";
  }
  return "?";
}

}  // namespace packpipe::plan
