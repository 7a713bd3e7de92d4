//! Net stack effect of each 3.11 opcode, matching CPython's `dis.stack_effect`
//! (Python/compile.c `stack_effect`). Checked against `dis` for every opcode in
//! `tests/test_bytecode_stack_effect.py`.

use crate::opcode::Opcode;

/// The stack effect of `op` with argument `arg`: `jump = Some(true)` when the jump is taken,
/// `Some(false)` when it is not, `None` for the larger of the two (as `dis` does).
pub fn stack_effect(op: Opcode, arg: u32, jump: Option<bool>) -> i64 {
    let arg = i64::from(arg);
    let branch = |taken: i64, not_taken: i64| match jump {
        Some(true) => taken,
        Some(false) => not_taken,
        None => taken.max(not_taken),
    };
    use Opcode::*;
    match op {
        Cache | Nop | ExtendedArg | Resume | UnaryPositive | UnaryNegative | UnaryNot
        | UnaryInvert | CheckExcMatch | CheckEgMatch | GetAiter | GetIter | GetYieldFromIter
        | ReturnGenerator | ListToTuple | SetupAnnotations | YieldValue | AsyncGenWrap
        | DeleteName | DeleteGlobal | Swap | LoadAttr | Jump | JumpNoInterrupt | DeleteFast
        | GetAwaitable | MakeCell | DeleteDeref | CopyFreeVars | KwNames => 0,
        PushNull | GetLen | MatchMapping | MatchSequence | MatchKeys | PushExcInfo
        | WithExceptStart | GetAnext | BeforeAsyncWith | BeforeWith | LoadBuildClass
        | LoadAssertionError | LoadConst | LoadName | ImportFrom | Copy | LoadFast
        | LoadClosure | LoadDeref | LoadClassderef | LoadMethod => 1,
        PopTop | BinarySubscr | PrintExpr | ReturnValue | ImportStar | PrepReraiseStar
        | PopExcept | StoreName | DeleteAttr | StoreGlobal | CompareOp | ImportName | IsOp
        | ContainsOp | Reraise | BinaryOp | StoreFast | StoreDeref | ListAppend | SetAdd
        | ListExtend | SetUpdate | DictMerge | DictUpdate | Call | PopJumpIfFalse
        | PopJumpIfTrue | PopJumpIfNone | PopJumpIfNotNone => -1,
        EndAsyncFor | DeleteSubscr | StoreAttr | MapAdd | MatchClass => -2,
        StoreSubscr => -3,
        UnpackSequence => arg - 1,
        UnpackEx => (arg & 0xff) + (arg >> 8),
        BuildTuple | BuildList | BuildSet | BuildString => 1 - arg,
        BuildMap => 1 - 2 * arg,
        BuildConstKeyMap | RaiseVarargs | Precall => -arg,
        LoadGlobal => 1 + (arg & 1),
        MakeFunction => {
            -((arg & 0x01 != 0) as i64
                + (arg & 0x02 != 0) as i64
                + (arg & 0x04 != 0) as i64
                + (arg & 0x08 != 0) as i64)
        }
        BuildSlice => {
            if arg == 3 {
                -2
            } else {
                -1
            }
        }
        CallFunctionEx => -2 - (arg & 1),
        FormatValue => {
            if arg & 0x04 != 0 {
                -1
            } else {
                0
            }
        }
        // The iterator stays on the stack and the next value is pushed; at the end both go.
        ForIter => branch(-1, 1),
        // Taken: the value stays; not taken: it is popped.
        JumpIfFalseOrPop | JumpIfTrueOrPop => branch(0, -1),
        Send => branch(-1, 0),
    }
}
