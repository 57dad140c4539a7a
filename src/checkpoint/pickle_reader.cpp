// The restricted pickle machine of pickle_reader.h: the opcodes of protocols
// 2-5 that torch.save and plain containers use, and the few globals a
// weights-only load builds. Python's pickletools documents each opcode.

#include "checkpoint/pickle_reader.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "checkpoint/pickle_globals.h"
#include "checkpoint/pickle_input.h"

namespace tandem::detail {
namespace {

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxObjects = 10'000'000;

// What the machine's stack and memo hold: a value, or one of the things
// only the machine sees (a mark, a named global, a storage reference).
struct Node {
  enum class Kind { kValue, kMark, kGlobal, kStorage };
  Kind kind = Kind::kValue;
  PickleRef value;
  std::string module, name;  // kGlobal
  std::shared_ptr<PickleTensor> storage;  // kStorage: key, dtype, location, numel

  static Node of(PickleRef v) {
    Node n;
    n.value = std::move(v);
    return n;
  }
  static Node mark() {
    Node n;
    n.kind = Kind::kMark;
    return n;
  }
};

class Machine {
 public:
  explicit Machine(std::string_view bytes) : in_(bytes) {}
  // A hostile pickle can make containers that hold themselves, which
  // shared_ptr alone would never free: every value not in the result is
  // emptied (the result has no cycle: run() checks).
  ~Machine() {
    for (const auto& v : made_) {
      if (kept_.count(v.get()) == 0) {
        v->items.clear();
        v->entries.clear();
      }
    }
  }
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  PickleRef run() {
    while (true) {
      const std::size_t at = in_.pos();
      const uint8_t op = in_.byte();
      if (op == '.') break;  // STOP
      step(op, at);
    }
    if (stack_.size() != 1 || stack_.back().kind != Node::Kind::kValue) {
      fail(in_.pos(), "the pickle ends with {} item(s) on its stack instead of one value",
           stack_.size());
    }
    PickleRef root = stack_.back().value;
    std::unordered_set<const PickleValue*> path;
    if (wrapped_.count(root.get())) fail(in_.pos(), "the pickle's value is a global or storage");
    (void)height(*root, path);
    for (const auto& [value, h] : heights_) kept_.insert(value);  // what the result holds
    kept_.insert(root.get());
    return root;
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(std::size_t at, fmt::format_string<Args...> f, Args&&... args) const {
    pickle_fail(at, f, std::forward<Args>(args)...);
  }

  PickleRef make(PickleValue::Kind kind) {
    if (++objects_ > kMaxObjects) fail(in_.pos(), "more than {} objects", kMaxObjects);
    auto v = std::make_shared<PickleValue>();
    v->kind = kind;
    made_.push_back(v);
    return v;
  }
  void push_value(PickleRef v) { stack_.push_back(Node::of(std::move(v))); }
  Node pop(std::size_t at) {
    if (stack_.empty() || stack_.back().kind == Node::Kind::kMark) {
      fail(at, "an opcode takes an item from an empty stack");
    }
    Node n = std::move(stack_.back());
    stack_.pop_back();
    return n;
  }
  PickleRef pop_value(std::size_t at, const char* what) {
    Node n = pop(at);
    if (n.kind != Node::Kind::kValue) fail(at, "{} expects a value, found {}", what, describe(n));
    return n.value;
  }
  Node& top(std::size_t at) {
    if (stack_.empty() || stack_.back().kind == Node::Kind::kMark) fail(at, "the stack is empty");
    return stack_.back();
  }
  // The items above the topmost mark, which is removed.
  std::vector<Node> pop_to_mark(std::size_t at) {
    std::size_t m = stack_.size();
    while (m > 0 && stack_[m - 1].kind != Node::Kind::kMark) --m;
    if (m == 0) fail(at, "an opcode needs a MARK that is not on the stack");
    std::vector<Node> items(std::make_move_iterator(stack_.begin() + m),
                            std::make_move_iterator(stack_.end()));
    stack_.resize(m - 1);
    return items;
  }
  static std::string describe(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kValue: return pickle_kind_name(n.value->kind);
      case Node::Kind::kMark: return "a MARK";
      case Node::Kind::kGlobal: return n.module + "." + n.name;
      case Node::Kind::kStorage: return "a storage";
    }
    return "?";
  }
  // A stack item as a value; a global or storage becomes a placeholder
  // (wrap()), which only REDUCE's arguments and persistent ids may hold:
  // anywhere else the final check refuses it.
  PickleRef as_value(Node n, std::size_t at, const char* what) {
    if (n.kind == Node::Kind::kMark) fail(at, "{} expects a value, found a MARK", what);
    return as_stack_value(std::move(n)).value;
  }

  PickleRef sequence(PickleValue::Kind kind, std::vector<Node> items, std::size_t at) {
    PickleRef v = make(kind);
    for (auto& n : items) v->items.push_back(as_value(std::move(n), at, "a tuple or list"));
    return v;
  }
  PickleRef& list_target(std::size_t at, const char* op) {
    Node& t = top(at);
    if (t.kind != Node::Kind::kValue || t.value->kind != PickleValue::Kind::kList) {
      fail(at, "{} appends to {}, not a list", op, describe(t));
    }
    return t.value;
  }
  PickleRef& dict_target(std::size_t at, const char* op) {
    Node& t = top(at);
    if (t.kind != Node::Kind::kValue || t.value->kind != PickleValue::Kind::kDict) {
      fail(at, "{} sets items of {}, not a dict", op, describe(t));
    }
    return t.value;
  }
  void memo_put(uint64_t index, std::size_t at) {
    memo_[index] = top(at);
  }
  void memo_get(uint64_t index, std::size_t at) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail(at, "memo entry {} is read before it is written", index);
    stack_.push_back(it->second);
  }

  int64_t int_of(const PickleRef& v, std::size_t at, const char* what) {
    if (v->kind != PickleValue::Kind::kInt) {
      fail(at, "{} must be an int, got {}", what, pickle_kind_name(v->kind));
    }
    return v->integer;
  }
  std::vector<int64_t> ints_of(const PickleRef& v, std::size_t at, const char* what) {
    if (v->kind != PickleValue::Kind::kTuple && v->kind != PickleValue::Kind::kList) {
      fail(at, "{} must be a tuple of ints, got {}", what, pickle_kind_name(v->kind));
    }
    std::vector<int64_t> out;
    for (const auto& e : v->items) out.push_back(int_of(e, at, what));
    return out;
  }

  // BINPERSID: ('storage', torch.<X>Storage, key, location, numel).
  Node persistent(PickleRef pid, std::size_t at) {
    if (pid->kind != PickleValue::Kind::kTuple || pid->items.size() != 5 ||
        pid->items[0]->kind != PickleValue::Kind::kString || pid->items[0]->text != "storage") {
      fail(at, "a persistent id that is not ('storage', type, key, location, numel)");
    }
    // The storage type was pushed as a global and wrapped: see step('Q').
    auto s = std::make_shared<PickleTensor>();
    const PickleRef& type = pid->items[1];
    s->dtype = type->kind == PickleValue::Kind::kString ? storage_dtype(type->text) : "";
    if (s->dtype.empty()) fail(at, "a storage of an unknown type");
    for (int i : {2, 3}) {
      if (pid->items[i]->kind != PickleValue::Kind::kString) {
        fail(at, "a storage key or location that is not a string");
      }
    }
    s->storage_key = pid->items[2]->text;
    s->location = pid->items[3]->text;
    s->storage_numel = int_of(pid->items[4], at, "a storage's element count");
    if (s->storage_numel < 0) fail(at, "a storage of {} elements", s->storage_numel);
    Node n;
    n.kind = Node::Kind::kStorage;
    n.storage = std::move(s);
    return n;
  }

  PickleRef rebuild_tensor(const std::vector<Node>& args, std::size_t at) {
    if (args.size() < 4 || args[0].kind != Node::Kind::kStorage) {
      fail(at, "_rebuild_tensor_v2 takes (storage, offset, size, stride, ...)");
    }
    auto t = std::make_shared<PickleTensor>(*args[0].storage);
    t->offset = int_of(as_value(args[1], at, "a tensor's offset"), at, "a tensor's offset");
    t->sizes = ints_of(as_value(args[2], at, "a tensor's size"), at, "a tensor's size");
    t->strides = ints_of(as_value(args[3], at, "a tensor's stride"), at, "a tensor's stride");
    if (args.size() > 4 && args[4].kind == Node::Kind::kValue &&
        args[4].value->kind == PickleValue::Kind::kBool) {
      t->requires_grad = args[4].value->boolean;
    }
    if (t->sizes.size() != t->strides.size()) {
      fail(at, "a tensor of {} sizes and {} strides", t->sizes.size(), t->strides.size());
    }
    PickleRef v = make(PickleValue::Kind::kTensor);
    v->tensor = std::move(t);
    return v;
  }

  // REDUCE: calls one of the allowed globals (never anything else).
  Node reduce(const Node& callable, PickleRef args_tuple, std::size_t at) {
    if (callable.kind != Node::Kind::kGlobal) {
      fail(at, "REDUCE calls {}, which is no allowed global", describe(callable));
    }
    if (args_tuple->kind != PickleValue::Kind::kTuple) fail(at, "REDUCE's arguments are no tuple");
    const std::string& f = callable.name;
    std::vector<Node> args;
    for (const auto& a : args_tuple->items) args.push_back(unwrap(a));
    if (f == "_rebuild_tensor_v2" || f == "_rebuild_tensor") {
      return Node::of(rebuild_tensor(args, at));
    }
    if (f == "_rebuild_parameter") {
      if (args.empty() || args[0].kind != Node::Kind::kValue ||
          args[0].value->kind != PickleValue::Kind::kTensor) {
        fail(at, "_rebuild_parameter takes a tensor");
      }
      return args[0];
    }
    if (f == "OrderedDict") return Node::of(make(PickleValue::Kind::kDict));
    if (deepspeed_record(callable.module, f)) {
      // A record: its class name now, its state at BUILD (see step('b')).
      PickleRef record = make(PickleValue::Kind::kDict);
      PickleRef key = make(PickleValue::Kind::kString);
      key->text = "__class__";
      PickleRef name = make(PickleValue::Kind::kString);
      name->text = callable.module + "." + f;
      record->entries.emplace_back(key, name);
      records_.insert(record.get());
      return Node::of(record);
    }
    if (f == "ZeroStageEnum") {  // ZeroStageEnum(n): the stage number
      if (args.size() != 1) fail(at, "ZeroStageEnum takes one int");
      PickleRef stage = as_value(args[0], at, "ZeroStageEnum");
      (void)int_of(stage, at, "ZeroStageEnum's value");
      return Node::of(stage);
    }
    if (f == "_rebuild_from_type_v2") {
      // (func, type, args, state): a tensor subclass rebuilt by func(*args);
      // only torch.Tensor itself, only through _rebuild_tensor_v2.
      if (args.size() != 4 || args[0].kind != Node::Kind::kGlobal ||
          args[0].name != "_rebuild_tensor_v2" || args[1].kind != Node::Kind::kGlobal ||
          args[1].name != "Tensor") {
        fail(at, "_rebuild_from_type_v2 of something other than a plain torch.Tensor");
      }
      PickleRef inner = as_value(args[2], at, "_rebuild_from_type_v2's arguments");
      if (inner->kind != PickleValue::Kind::kTuple) fail(at, "_rebuild_from_type_v2's args");
      std::vector<Node> inner_args;
      for (const auto& a : inner->items) inner_args.push_back(unwrap(a));
      return Node::of(rebuild_tensor(inner_args, at));
    }
    if (f == "Size") {
      if (args.size() != 1) fail(at, "torch.Size takes one tuple");
      PickleRef t = as_value(args[0], at, "torch.Size");
      PickleRef out = make(PickleValue::Kind::kTuple);
      for (int64_t d : ints_of(t, at, "torch.Size")) {
        PickleRef e = make(PickleValue::Kind::kInt);
        e->integer = d;
        out->items.push_back(e);
      }
      return Node::of(out);
    }
    if (f == "set" || f == "frozenset") {
      PickleRef out = make(PickleValue::Kind::kList);
      if (!args.empty()) {
        PickleRef items = as_value(args[0], at, "set");
        if (items->kind != PickleValue::Kind::kList && items->kind != PickleValue::Kind::kTuple) {
          fail(at, "set takes a list");
        }
        out->items = items->items;
      }
      return Node::of(out);
    }
    if (f == "encode") {  // protocol 2's bytes: _codecs.encode(text, "latin1")
      if (args.size() != 2) fail(at, "_codecs.encode takes (text, encoding)");
      PickleRef text = as_value(args[0], at, "_codecs.encode");
      PickleRef encoding = as_value(args[1], at, "_codecs.encode");
      if (text->kind != PickleValue::Kind::kString ||
          encoding->kind != PickleValue::Kind::kString ||
          (encoding->text != "latin1" && encoding->text != "latin-1")) {
        fail(at, "_codecs.encode of something other than latin-1 text");
      }
      PickleRef out = make(PickleValue::Kind::kBytes);
      if (!latin1_bytes(text->text, &out->text)) {
        fail(at, "_codecs.encode of text outside latin-1");
      }
      return Node::of(out);
    }
    // Storage types are only arguments of persistent ids.
    fail(at, "REDUCE calls {}.{}, which a weights-only read does not call", callable.module, f);
  }

  // A value that stands for a global or a storage (see step('c'), 'Q').
  Node unwrap(const PickleRef& v) {
    auto it = wrapped_.find(v.get());
    return it == wrapped_.end() ? Node::of(v) : it->second;
  }
  PickleRef wrap(Node n) {
    // Globals and storages travel inside tuples (REDUCE's arguments, a
    // persistent id) as placeholder values that unwrap() turns back.
    PickleRef placeholder = make(PickleValue::Kind::kString);
    if (n.kind == Node::Kind::kGlobal) placeholder->text = n.name;
    wrapped_[placeholder.get()] = std::move(n);
    // Kept alive: wrapped_ is keyed by address, which a freed placeholder
    // would hand on to the next value made.
    placeholders_.push_back(placeholder);
    return placeholder;
  }
  Node as_stack_value(Node n) {
    if (n.kind == Node::Kind::kGlobal || n.kind == Node::Kind::kStorage) {
      return Node::of(wrap(std::move(n)));
    }
    return n;
  }

  void step(uint8_t op, std::size_t at) {
    using K = PickleValue::Kind;
    switch (op) {
      case 0x80: (void)in_.byte(); return;                    // PROTO
      case 0x95: (void)in_.take(8); return;                   // FRAME
      case '(': stack_.push_back(Node::mark()); return;  // MARK
      case '}': push_value(make(K::kDict)); return;       // EMPTY_DICT
      case ']': push_value(make(K::kList)); return;       // EMPTY_LIST
      case ')': push_value(make(K::kTuple)); return;      // EMPTY_TUPLE
      case 0x8f: push_value(make(K::kList)); return;      // EMPTY_SET (as a list)
      case 'N': push_value(make(K::kNone)); return;       // NONE
      case 0x88:
      case 0x89: {                                        // NEWTRUE, NEWFALSE
        PickleRef v = make(K::kBool);
        v->boolean = op == 0x88;
        push_value(v);
        return;
      }
      case 'J':
      case 'K':
      case 'M': {                                         // BININT, BININT1, BININT2
        PickleRef v = make(K::kInt);
        v->integer = op == 'J' ? static_cast<int32_t>(in_.unsigned_le(4))
                               : static_cast<int64_t>(in_.unsigned_le(op == 'K' ? 1 : 2));
        push_value(v);
        return;
      }
      case 0x8a:
      case 0x8b: {                                        // LONG1, LONG4
        const uint64_t n = op == 0x8a ? in_.unsigned_le(1) : in_.unsigned_le(4);
        PickleRef v = make(K::kInt);
        v->integer = in_.signed_le(n);
        push_value(v);
        return;
      }
      case 'G': {                                         // BINFLOAT (big-endian)
        PickleRef v = make(K::kFloat);
        v->number = in_.float_be();
        push_value(v);
        return;
      }
      case 'X':
      case 0x8c:
      case 0x8d:
      case 'T':
      case 'U': {  // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, BINSTRING, SHORT_BINSTRING
        const uint64_t n = op == 0x8c || op == 'U' ? in_.unsigned_le(1)
                           : op == 0x8d             ? in_.unsigned_le(8)
                                                    : in_.unsigned_le(4);
        PickleRef v = make(K::kString);
        v->text = std::string(in_.take(n));
        push_value(v);
        return;
      }
      case 'B':
      case 'C':
      case 0x8e: {                                        // BINBYTES, SHORT_BINBYTES, BINBYTES8
        const uint64_t n = op == 'C'   ? in_.unsigned_le(1)
                           : op == 'B' ? in_.unsigned_le(4)
                                       : in_.unsigned_le(8);
        PickleRef v = make(K::kBytes);
        v->text = std::string(in_.take(n));
        push_value(v);
        return;
      }
      case 't': push_value(sequence(K::kTuple, pop_to_mark(at), at)); return;  // TUPLE
      case 'l': push_value(sequence(K::kList, pop_to_mark(at), at)); return;   // LIST
      case 0x85:
      case 0x86:
      case 0x87: {                                        // TUPLE1, TUPLE2, TUPLE3
        const int n = op - 0x84;
        std::vector<Node> items(n);
        for (int i = n - 1; i >= 0; --i) items[i] = as_stack_value(pop(at));
        push_value(sequence(K::kTuple, std::move(items), at));
        return;
      }
      case 'd': {                                         // DICT
        std::vector<Node> items = pop_to_mark(at);
        if (items.size() % 2 != 0) fail(at, "DICT with an odd number of items");
        PickleRef d = make(K::kDict);
        for (std::size_t i = 0; i < items.size(); i += 2) {
          pickle_dict_set(*d, as_value(items[i], at, "a dict key"),
                   as_value(items[i + 1], at, "a dict value"));
        }
        push_value(d);
        return;
      }
      case 'a': {                                         // APPEND
        PickleRef v = pop_value(at, "APPEND");
        list_target(at, "APPEND")->items.push_back(std::move(v));
        return;
      }
      case 'e':
      case 0x90: {                                        // APPENDS, ADDITEMS
        std::vector<Node> items = pop_to_mark(at);
        PickleRef& list = list_target(at, op == 'e' ? "APPENDS" : "ADDITEMS");
        for (auto& n : items) list->items.push_back(as_value(std::move(n), at, "APPENDS"));
        return;
      }
      case 0x91: push_value(sequence(K::kList, pop_to_mark(at), at)); return;  // FROZENSET
      case 's': {                                         // SETITEM
        PickleRef value = pop_value(at, "SETITEM");
        PickleRef key = pop_value(at, "SETITEM");
        pickle_dict_set(*dict_target(at, "SETITEM"), std::move(key), std::move(value));
        return;
      }
      case 'u': {                                         // SETITEMS
        std::vector<Node> items = pop_to_mark(at);
        if (items.size() % 2 != 0) fail(at, "SETITEMS with an odd number of items");
        PickleRef& d = dict_target(at, "SETITEMS");
        for (std::size_t i = 0; i < items.size(); i += 2) {
          pickle_dict_set(*d, as_value(items[i], at, "a dict key"),
                   as_value(items[i + 1], at, "a dict value"));
        }
        return;
      }
      case 'q': memo_put(in_.unsigned_le(1), at); return;     // BINPUT
      case 'r': memo_put(in_.unsigned_le(4), at); return;     // LONG_BINPUT
      case 0x94: memo_put(memo_.size(), at); return;      // MEMOIZE
      case 'h': memo_get(in_.unsigned_le(1), at); return;     // BINGET
      case 'j': memo_get(in_.unsigned_le(4), at); return;     // LONG_BINGET
      case '0': (void)pop(at); return;                    // POP
      case '1': (void)pop_to_mark(at); return;            // POP_MARK
      case '2': stack_.push_back(top(at)); return;        // DUP
      case 'c':
      case 0x93: {                                        // GLOBAL, STACK_GLOBAL
        Node g;
        g.kind = Node::Kind::kGlobal;
        if (op == 'c') {
          g.module = in_.line();
          g.name = in_.line();
        } else {
          PickleRef name = pop_value(at, "STACK_GLOBAL");
          PickleRef module = pop_value(at, "STACK_GLOBAL");
          if (name->kind != K::kString || module->kind != K::kString) {
            fail(at, "STACK_GLOBAL's module and name are not strings");
          }
          g.module = module->text;
          g.name = name->text;
        }
        if (g.module == "torch._utils" && g.name == "_rebuild_tensor_v3") {
          fail(at, "the pickle holds a tensor of a dtype torch.save writes through "
               "torch._utils._rebuild_tensor_v3 (float8, uint16, uint32 or uint64), which "
               "tandem's reader does not build yet; save such tensors with "
               "safetensors.torch.save_file, which tandem reads in every dtype");
        }
        if (!allowed_global(g.module, g.name)) {
          fail(at, "the pickle refers to {}.{}, which a weights-only read does not build "
               "(only tensors, containers and numbers); nothing was executed",
               g.module, g.name);
        }
        stack_.push_back(std::move(g));
        return;
      }
      case 'Q': {                                         // BINPERSID
        PickleRef pid = pop_value(at, "BINPERSID");
        // The storage type inside the id is a global placeholder: name it.
        if (pid->kind == K::kTuple && pid->items.size() == 5) {
          Node type = unwrap(pid->items[1]);
          if (type.kind == Node::Kind::kGlobal && type.module == "torch") {
            PickleRef name = make(K::kString);
            name->text = type.name;
            pid->items[1] = name;
          }
        }
        stack_.push_back(persistent(pid, at));
        return;
      }
      case 'R': {                                         // REDUCE
        PickleRef args = pop_value(at, "REDUCE");
        Node callable = pop(at);
        stack_.push_back(as_stack_value(reduce(callable, std::move(args), at)));
        return;
      }
      case 0x81: {                                        // NEWOBJ
        PickleRef args = pop_value(at, "NEWOBJ");
        Node cls = pop(at);
        stack_.push_back(as_stack_value(reduce(cls, std::move(args), at)));
        return;
      }
      case 'b': {                                         // BUILD
        PickleRef state = pop_value(at, "BUILD");
        Node& target = top(at);
        // A DeepSpeed record takes its state's entries; an OrderedDict's or a
        // tensor's state is nothing a weights-only read keeps (torch.save
        // writes an empty state or a dict of metadata).
        if (target.kind != Node::Kind::kValue) fail(at, "BUILD on {}", describe(target));
        if (records_.count(target.value.get()) > 0) {
          if (state->kind != K::kDict) fail(at, "a DeepSpeed record's state is not a dict");
          for (const auto& [key, value] : state->entries) pickle_dict_set(*target.value, key, value);
        }
        return;
      }
      default:
        break;
    }
    fail(at, "opcode 0x{:02x} is not one a weights-only read takes (torch.save writes "
         "protocol 2)",
         op);
  }

  // The nesting height of `v` (memoized: shared values are checked once),
  // refusing cycles, placeholders left as data, and more than kMaxDepth.
  int height(const PickleValue& v, std::unordered_set<const PickleValue*>& path) {
    auto known = heights_.find(&v);
    if (known != heights_.end()) return known->second;
    if (!path.insert(&v).second) fail(in_.pos(), "a container contains itself");
    int h = 0;
    auto visit = [&](const PickleRef& child) {
      if (wrapped_.count(child.get())) fail(in_.pos(), "a global or storage stands where data should");
      h = std::max(h, 1 + height(*child, path));
      if (h > kMaxDepth) fail(in_.pos(), "values nest deeper than {} levels", kMaxDepth);
    };
    for (const auto& item : v.items) visit(item);
    for (const auto& [key, value] : v.entries) {
      visit(key);
      visit(value);
    }
    path.erase(&v);
    heights_[&v] = h;
    return h;
  }

  PickleInput in_;
  std::vector<Node> stack_;
  std::unordered_map<uint64_t, Node> memo_;
  std::unordered_map<const PickleValue*, Node> wrapped_;
  std::vector<PickleRef> placeholders_;
  std::unordered_set<const PickleValue*> records_;  // DeepSpeed records, for BUILD
  std::unordered_map<const PickleValue*, int> heights_;
  std::vector<PickleRef> made_;  // every value, to break cycles in ~Machine
  std::unordered_set<const PickleValue*> kept_;
  int64_t objects_ = 0;
};

}  // namespace

PickleRef read_pickle(std::string_view bytes) { return Machine(bytes).run(); }

}  // namespace tandem::detail
