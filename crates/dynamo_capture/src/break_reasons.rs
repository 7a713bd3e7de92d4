//! Why the translator stops: every unsupported construct is one kind of graph break, with a
//! stable code, a one-line explanation and a hint for the user. `docs/graph-breaks.md` is
//! generated from [`BreakKind::ALL`] (`tools/graph_break_docs.py`, checked by `make lint`),
//! so codes are never renumbered: new kinds take the next free code.
//!
//! Each site of the translator that gives up names its kind (`capture::translator::unsupported`
//! takes one), so adding a kind is a compile error until the table describes it: the match in
//! [`BreakKind::info`] has no wildcard arm.

/// The kind of a graph break (or of a frame run eagerly when it cannot be split).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakKind {
    DataDependentBranch,
    TensorValueNeeded,
    UnsupportedCall,
    UnsupportedInstruction,
    UnsupportedOperation,
    UnreplayableSideEffect,
    ValueNotRebuildable,
    ExceptionWhileTracing,
    TensorOperationInTry,
    ContextManager,
    SuperCall,
    Hooks,
    ClosureCell,
    UndefinedName,
    Import,
    FakeTensorFailure,
    RecursionDepth,
    Generator,
    Environment,
    ModelOutput,
    Internal,
    Requested,
    BackendFallback,
}

/// What the documentation and the logs say about one kind.
#[derive(Clone, Copy, Debug)]
pub struct BreakInfo {
    pub code: &'static str,
    pub title: &'static str,
    pub explanation: &'static str,
    pub hint: &'static str,
}

impl BreakKind {
    /// Every kind, in code order.
    pub const ALL: [BreakKind; 23] = [
        BreakKind::DataDependentBranch,
        BreakKind::TensorValueNeeded,
        BreakKind::UnsupportedCall,
        BreakKind::UnsupportedInstruction,
        BreakKind::UnsupportedOperation,
        BreakKind::UnreplayableSideEffect,
        BreakKind::ValueNotRebuildable,
        BreakKind::ExceptionWhileTracing,
        BreakKind::TensorOperationInTry,
        BreakKind::ContextManager,
        BreakKind::SuperCall,
        BreakKind::Hooks,
        BreakKind::ClosureCell,
        BreakKind::UndefinedName,
        BreakKind::Import,
        BreakKind::FakeTensorFailure,
        BreakKind::RecursionDepth,
        BreakKind::Generator,
        BreakKind::Environment,
        BreakKind::ModelOutput,
        BreakKind::Internal,
        BreakKind::Requested,
        BreakKind::BackendFallback,
    ];

    pub fn info(self) -> BreakInfo {
        let (code, title, explanation, hint) = match self {
            BreakKind::DataDependentBranch => (
                "GB0001",
                "Control flow on a tensor's value",
                "An `if`, `while`, `and`/`or` or `not` depends on the values inside a tensor, \
                 which are unknown while tracing: the graph ends before the branch and each \
                 side continues in a resume function.",
                "Use `torch.where` or `torch.cond` to keep both sides in one graph, or move \
                 the check out of the compiled function.",
            ),
            BreakKind::TensorValueNeeded => (
                "GB0002",
                "A tensor's value needed as a Python value",
                "`.item()`, `.tolist()`, `int(t)`, `float(t)`, formatting or NumPy conversion \
                 need the tensor's data, which only exists when the graph runs.",
                "Keep the value as a tensor (0-d tensors work in arithmetic), or read it after \
                 the compiled region.",
            ),
            BreakKind::UnsupportedCall => (
                "GB0003",
                "A call the translator cannot follow",
                "A builtin, a C extension, or an object whose behaviour the translator does \
                 not model is called (`print`, logging, I/O, arbitrary native code). The call \
                 runs as it is between two graphs.",
                "Move the call out of the hot path, or wrap tensor code in a custom operator \
                 (`torch.library`) so it becomes one graph node.",
            ),
            BreakKind::UnsupportedInstruction => (
                "GB0004",
                "A bytecode instruction the translator does not implement",
                "The frame uses an instruction (or a form of one) that has no translation yet.",
                "Please report it with the function's source; rewriting the construct (a \
                 comprehension as a loop, a match statement as if/elif) usually avoids it.",
            ),
            BreakKind::UnsupportedOperation => (
                "GB0005",
                "An operation on a value of an unsupported kind",
                "An operator, index, `len`, `in`, attribute or iteration is applied to a value \
                 the translator does not model that way (an opaque object, a mixture of \
                 tensors and Python containers).",
                "Use plain tuples, lists, dicts and tensors in the compiled code, or do the \
                 operation outside it.",
            ),
            BreakKind::UnreplayableSideEffect => (
                "GB0006",
                "A change to existing state that cannot be replayed",
                "The code changes an object that existed before the call (an item of an \
                 argument's container, an attribute through a custom `__setattr__`, a closure \
                 cell shared with other code) in a way the generated code cannot redo after \
                 the graph.",
                "Return the new value instead of storing it into the argument, or make the \
                 change outside the compiled function.",
            ),
            BreakKind::ValueNotRebuildable => (
                "GB0007",
                "A value made while tracing cannot be handed back",
                "The frame returns, or keeps live across a graph break, a value built during \
                 the trace that the generated code cannot rebuild (a function or object made \
                 in the trace, an object reached twice).",
                "Return tensors, tuples, lists and dicts; build helper objects outside the \
                 compiled function.",
            ),
            BreakKind::ExceptionWhileTracing => (
                "GB0008",
                "Python raised while tracing",
                "Evaluating part of the frame at trace time raised (a missing key, an index \
                 out of range, an error in user code): the frame runs as it is and raises \
                 the same way.",
                "If the exception is expected, catch it outside the compiled function.",
            ),
            BreakKind::TensorOperationInTry => (
                "GB0009",
                "A tensor operation inside a try block, with state changed in its graph",
                "Operations inside a `try` block go into the graph; a graph that raises makes \
                 the frame run again eagerly from the start, so the exception meets the \
                 block's `except` as in eager. That needs a graph that changes nothing a \
                 second run would see — random numbers drawn from the default generators \
                 (dropout in training) are drawn again from the state they were drawn from: \
                 with an in-place operation, running statistics (batch norm in training) or \
                 random numbers from a generator passed in, in the same graph, or in a \
                 generator function (which cannot be run again as a call), the operation \
                 runs as it is, under the block's handler.",
                "Keep the state-changing operation out of the graph of the `try` block: move \
                 the `try` around the smallest code that can raise, or the in-place operation \
                 after the block.",
            ),
            BreakKind::ContextManager => (
                "GB0010",
                "A context manager the translator does not follow",
                "Grad-mode context managers (`torch.no_grad()`, `torch.enable_grad()`), \
                 `torch.autocast`, `torch.inference_mode` and `sdpa_kernel` with constant \
                 arguments and classes with Python `__enter__`/`__exit__` are traced; the \
                 block of any other runs in a resume function, entered as it is. A resume \
                 function handed such a block by a graph break inside it enters it again \
                 itself.",
                "Move the `with` statement outside the compiled function when it does not \
                 affect the tensor computation.",
            ),
            BreakKind::SuperCall => (
                "GB0011",
                "A `super()` call the translator cannot resolve",
                "`super()` is used outside a method with a `__class__` cell, on a value without \
                 a Python object, or finds an attribute the translator cannot follow.",
                "Call the base class's method explicitly (`Base.method(self, ...)`).",
            ),
            BreakKind::Hooks => (
                "GB0012",
                "Module hooks",
                "Global module hooks or hooks of a kind the translator does not inline are \
                 registered; the module call runs as it is.",
                "Remove global hooks while running compiled code.",
            ),
            BreakKind::ClosureCell => (
                "GB0013",
                "A closure cell the translator cannot follow",
                "A free variable is unbound, or its cell is not one the trace knows.",
                "Pass the value as an argument instead of capturing it.",
            ),
            BreakKind::UndefinedName => (
                "GB0014",
                "An undefined name",
                "The frame reads an undefined global or an unbound local: it raises `NameError` \
                 or `UnboundLocalError` when run, as it does here.",
                "Define the name before the call.",
            ),
            BreakKind::Import => (
                "GB0015",
                "An import that would run module code",
                "Importing a module that is not loaded yet runs its code; relative imports \
                 need the package context.",
                "Import at module level.",
            ),
            BreakKind::FakeTensorFailure => (
                "GB0016",
                "A tensor operation failed on fake tensors",
                "Running the operation on fake tensors (shapes and dtypes only) raised: the \
                 arguments are invalid, or the operation has no fake implementation. The \
                 operation runs as it is (and raises the real error, if any).",
                "Check the shapes and dtypes of the arguments.",
            ),
            BreakKind::RecursionDepth => (
                "GB0017",
                "Calls or containers nested too deep",
                "Inlining went deeper than the translator allows (usually recursion), or a \
                 list, tuple or dict read by the trace contains itself or is nested deeper \
                 than the translator follows.",
                "Rewrite recursion as a loop, or compile the recursive function separately; \
                 pass the parts of a self-referencing structure the code needs.",
            ),
            BreakKind::Generator => (
                "GB0018",
                "A generator or coroutine",
                "Generator and coroutine functions, and frames that are generators, are run \
                 as they are.",
                "Use lists or loops in the compiled code.",
            ),
            BreakKind::Environment => (
                "GB0019",
                "Reading the environment",
                "`os.environ` is read in a way the guard cannot check (a key that is not a \
                 str, a method other than lookups, an unset variable).",
                "Read environment variables outside the compiled function.",
            ),
            BreakKind::ModelOutput => (
                "GB0020",
                "A transformers ModelOutput used in an unsupported way",
                "A `ModelOutput` field is missing, set twice, or changed after construction in \
                 a way the translator does not model.",
                "Build the output once with all its fields.",
            ),
            BreakKind::Internal => (
                "GB0021",
                "An internal limitation of dynamo-rs",
                "The translator reached a state it does not handle (a bug, or a corner not \
                 built yet). The frame runs as it is.",
                "Please report it with the function's source and the log line.",
            ),
            BreakKind::Requested => (
                "GB0022",
                "A graph break the program asks for",
                "`torch._dynamo.graph_break()` ends the graph where it is called, and a \
                 function disabled with `torch.compiler.disable` (or `torch._dynamo.disable`) \
                 runs as it is, nothing it calls compiled — as under TorchDynamo: the code \
                 after it continues in a resume function.",
                "Remove the call (or the `disable`) to keep the code in one graph.",
            ),
            BreakKind::BackendFallback => (
                "GB0023",
                "The backend met a limit of fake tensors",
                "The backend raised one of the errors torch.compile takes as a graph break: \
                 an operation whose output shape depends on the data (for instance the \
                 backward of `x[mask] = v` with a boolean mask, which AOTAutograd traces when \
                 the graph is differentiated) or one without a fake implementation. The frame \
                 runs eagerly, as under torch.compile.",
                "Write a boolean-mask assignment as `x = torch.where(mask, v, x)`, whose \
                 shapes do not depend on the data.",
            ),
        };
        BreakInfo {
            code,
            title,
            explanation,
            hint,
        }
    }
}

/// One reason the translator stopped: the kind, and what exactly (`calling print`).
#[derive(Debug, Clone)]
pub struct Break {
    pub kind: BreakKind,
    pub detail: String,
}

impl Break {
    pub fn new(kind: BreakKind, detail: impl Into<String>) -> Break {
        Break {
            kind,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}]", self.detail, self.kind.info().code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_in_order() {
        let codes: Vec<&str> = BreakKind::ALL.iter().map(|k| k.info().code).collect();
        for (i, code) in codes.iter().enumerate() {
            assert_eq!(*code, format!("GB{:04}", i + 1));
        }
    }

    #[test]
    fn every_kind_is_listed() {
        for kind in BreakKind::ALL {
            assert_eq!(
                BreakKind::ALL.iter().filter(|k| **k == kind).count(),
                1,
                "{kind:?}"
            );
            let info = kind.info();
            assert!(!info.title.is_empty() && !info.explanation.is_empty());
            assert!(!info.hint.is_empty());
        }
    }
}
