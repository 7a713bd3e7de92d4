//! Property tests: any well-formed instruction list survives encode → decode unchanged, and
//! no byte string makes a decoder panic (they return `BytecodeError` instead).

use dynamo_bytecode::opcode::Opcode;
use dynamo_bytecode::{
    decode, encode, ExceptionHandler, InstrIndex, Instruction, Operand, OperandKind, Positions,
    RawCode,
};
use proptest::prelude::*;

fn positions() -> impl Strategy<Value = Positions> {
    prop_oneof![
        Just(Positions::default()),
        (-5i32..5000).prop_map(|line| Positions {
            line: Some(line),
            end_line: Some(line),
            col: None,
            end_col: None
        }),
        (-5i32..5000, 0i32..40, 0u32..300, 0u32..300).prop_map(|(line, extra, col, end_col)| {
            Positions {
                line: Some(line),
                end_line: Some(line + extra),
                col: Some(col),
                end_col: Some(end_col),
            }
        }),
        (-5i32..5000, 1i32..40).prop_map(|(line, extra)| Positions {
            line: Some(line),
            end_line: Some(line + extra),
            col: None,
            end_col: None,
        }),
    ]
}

/// An argument that is small most of the time and sometimes needs 1-3 EXTENDED_ARGs.
fn argument() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..256, 1 => 256u32..70_000, 1 => any::<u32>()]
}

#[derive(Clone, Debug)]
struct Draft {
    opcode: usize,
    arg: u32,
    target: usize,
    positions: Positions,
    handler: Option<(usize, u32, bool)>,
}

fn draft() -> impl Strategy<Value = Draft> {
    (
        0..Opcode::ALL.len(),
        argument(),
        any::<usize>(),
        positions(),
        proptest::option::weighted(0.3, (any::<usize>(), 0u32..100_000, any::<bool>())),
    )
        .prop_map(|(opcode, arg, target, positions, handler)| Draft {
            opcode,
            arg,
            target,
            positions,
            handler,
        })
}

/// Turns drafts into a well-formed list: operands of the right kind, targets in range, and
/// jumps that CPython 3.11 can only encode forward pointed forward.
fn build(drafts: &[Draft]) -> Vec<Instruction> {
    let len = drafts.len();
    drafts
        .iter()
        .enumerate()
        .map(|(index, d)| {
            let mut opcode = Opcode::ALL[d.opcode];
            if opcode == Opcode::ExtendedArg {
                opcode = Opcode::Nop;
            }
            let operand = match opcode.operand_kind() {
                OperandKind::Jump => {
                    let forward_only = opcode.backward_byte().is_none();
                    if forward_only && index + 1 >= len {
                        opcode = Opcode::Nop;
                        Operand::None
                    } else if forward_only {
                        Operand::Jump(InstrIndex(
                            (index + 1 + d.target % (len - index - 1)) as u32,
                        ))
                    } else {
                        Operand::Jump(InstrIndex((d.target % len) as u32))
                    }
                }
                kind => Operand::from_raw(kind, d.arg),
            };
            let handler = d.handler.map(|(target, depth, lasti)| ExceptionHandler {
                target: InstrIndex((target % len) as u32),
                depth,
                lasti,
            });
            Instruction {
                opcode,
                operand,
                positions: d.positions,
                handler,
            }
        })
        .collect()
}

/// What decoding gives back: 3.11 has no forward "no interrupt" jump, so a forward
/// `JUMP_NO_INTERRUPT` is written as `JUMP_FORWARD` and read back as `JUMP` (the same thing:
/// in 3.11 only backward jumps check for interrupts).
fn canonical(mut instructions: Vec<Instruction>) -> Vec<Instruction> {
    for (index, instruction) in instructions.iter_mut().enumerate() {
        if let (Opcode::JumpNoInterrupt, Some(target)) =
            (instruction.opcode, instruction.jump_target())
        {
            if target.index() > index {
                instruction.opcode = Opcode::Jump;
            }
        }
    }
    instructions
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn encode_then_decode_is_identity(drafts in prop::collection::vec(draft(), 1..120), first_line in -3i32..3000) {
        let instructions = build(&drafts);
        let (code, exception_table, line_table) = encode(&instructions, first_line).unwrap();
        let decoded = decode(RawCode { code: &code, exception_table: &exception_table, line_table: &line_table, first_line }).unwrap();
        prop_assert_eq!(decoded.instructions, canonical(instructions));
    }

    #[test]
    fn decoders_never_panic_on_random_bytes(
        code in prop::collection::vec(any::<u8>(), 0..400),
        exception_table in prop::collection::vec(any::<u8>(), 0..64),
        line_table in prop::collection::vec(any::<u8>(), 0..64),
        first_line in any::<i32>(),
    ) {
        let _ = decode(RawCode { code: &code, exception_table: &exception_table, line_table: &line_table, first_line });
    }

    #[test]
    fn decoders_never_panic_on_corrupted_valid_code(
        drafts in prop::collection::vec(draft(), 1..60),
        flips in prop::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let instructions = build(&drafts);
        let (mut code, mut exception_table, mut line_table) = encode(&instructions, 1).unwrap();
        for (at, byte, which) in flips {
            let table = match which { 0 => &mut code, 1 => &mut exception_table, _ => &mut line_table };
            if !table.is_empty() {
                let at = at % table.len();
                table[at] = byte;
            }
        }
        if let Ok(decoded) = decode(RawCode { code: &code, exception_table: &exception_table, line_table: &line_table, first_line: 1 }) {
            // Whatever decodes must also re-encode (or fail with an error, never a panic).
            let _ = encode(&decoded.instructions, 1);
            let _ = dynamo_bytecode::stack_depth::stack_depths(&decoded.instructions, 0);
            let _ = dynamo_bytecode::liveness::liveness(&decoded.instructions, 64);
            let _ = dynamo_bytecode::cfg::Cfg::build(&decoded.instructions);
        }
    }
}
