//! Symbolic-shape guard expressions: what torch's ShapeEnv recorded while a frame was traced
//! (`2*s0 >= 16`, `s1 == s0`, `s0 >= 2`), with each symbol replaced by the index of a value
//! the guard reads on every call (an input's size or stride). Evaluated here, natively, with
//! Python's integer semantics (floor division and modulo round toward negative infinity);
//! an overflow or a division by zero makes the expression *not hold*, so the frame is
//! compiled again rather than run with a guard we could not decide.

/// A value an expression computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Value {
    fn as_f64(self) -> f64 {
        match self {
            Value::Int(i) => i as f64,
            Value::Float(f) => f,
            Value::Bool(b) => f64::from(u8::from(b)),
        }
    }

    fn as_int(self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(i64::from(b)),
            Value::Float(_) => None,
        }
    }

    fn truth(self) -> bool {
        match self {
            Value::Int(i) => i != 0,
            Value::Float(f) => f != 0.0,
            Value::Bool(b) => b,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Pow,
    FloorDiv,
    Mod,
    TrueDiv,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Many {
    Add,
    Mul,
    Max,
    Min,
    And,
    Or,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    Not,
    Floor,
    Ceil,
    Trunc,
    ToFloat,
}

/// An expression over the values read by a shape guard.
#[derive(Clone, Debug, PartialEq)]
pub enum ShapeExpr {
    /// The value read at this index.
    Read(usize),
    Const(Value),
    Unary(Unary, Box<ShapeExpr>),
    Binary(Binary, Box<ShapeExpr>, Box<ShapeExpr>),
    Many(Many, Vec<ShapeExpr>),
}

impl ShapeExpr {
    /// The value of the expression with `reads` as the values read; None when it cannot be
    /// computed (an index out of range, overflow, division by zero, a type mismatch).
    pub fn eval(&self, reads: &[Value]) -> Option<Value> {
        Some(match self {
            ShapeExpr::Read(i) => *reads.get(*i)?,
            ShapeExpr::Const(v) => *v,
            ShapeExpr::Unary(op, a) => {
                let a = a.eval(reads)?;
                match op {
                    Unary::Not => Value::Bool(!a.truth()),
                    Unary::ToFloat => Value::Float(a.as_f64()),
                    Unary::Floor | Unary::Ceil | Unary::Trunc => match a {
                        Value::Float(f) => {
                            let r = match op {
                                Unary::Floor => f.floor(),
                                Unary::Ceil => f.ceil(),
                                _ => f.trunc(),
                            };
                            float_to_int(r)?
                        }
                        other => Value::Int(other.as_int()?),
                    },
                }
            }
            ShapeExpr::Binary(op, a, b) => binary(*op, a.eval(reads)?, b.eval(reads)?)?,
            ShapeExpr::Many(op, items) => {
                let mut values = items.iter().map(|e| e.eval(reads));
                let first = values.next()??;
                let mut acc = first;
                for v in values {
                    acc = many(*op, acc, v?)?;
                }
                acc
            }
        })
    }

    /// Whether the expression holds for `reads` (false when it cannot be computed).
    pub fn holds(&self, reads: &[Value]) -> bool {
        self.eval(reads).is_some_and(Value::truth)
    }

    /// The largest read index the expression uses, if any.
    pub fn max_read(&self) -> Option<usize> {
        match self {
            ShapeExpr::Read(i) => Some(*i),
            ShapeExpr::Const(_) => None,
            ShapeExpr::Unary(_, a) => a.max_read(),
            ShapeExpr::Binary(_, a, b) => a.max_read().max(b.max_read()),
            ShapeExpr::Many(_, items) => items.iter().filter_map(ShapeExpr::max_read).max(),
        }
    }
}

fn float_to_int(f: f64) -> Option<Value> {
    (f.is_finite() && f.abs() < 9.0e18).then_some(Value::Int(f as i64))
}

fn binary(op: Binary, a: Value, b: Value) -> Option<Value> {
    use Binary::*;
    let ints = a.as_int().zip(b.as_int());
    Some(match op {
        Eq | Ne | Lt | Le | Gt | Ge => {
            let ordering = match ints {
                Some((x, y)) => x.cmp(&y),
                None => a.as_f64().partial_cmp(&b.as_f64())?,
            };
            use std::cmp::Ordering::*;
            Value::Bool(match op {
                Eq => ordering == Equal,
                Ne => ordering != Equal,
                Lt => ordering == Less,
                Le => ordering != Greater,
                Gt => ordering == Greater,
                _ => ordering != Less,
            })
        }
        TrueDiv => {
            let d = b.as_f64();
            if d == 0.0 {
                return None;
            }
            Value::Float(a.as_f64() / d)
        }
        FloorDiv => match ints {
            Some((x, y)) => Value::Int(floor_div(x, y)?),
            None => {
                let d = b.as_f64();
                if d == 0.0 {
                    return None;
                }
                Value::Float((a.as_f64() / d).floor())
            }
        },
        Mod => match ints {
            Some((x, y)) => Value::Int(x.checked_sub(floor_div(x, y)?.checked_mul(y)?)?),
            None => {
                let (x, y) = (a.as_f64(), b.as_f64());
                if y == 0.0 {
                    return None;
                }
                Value::Float(x - (x / y).floor() * y)
            }
        },
        Pow => match ints {
            Some((x, y)) if y >= 0 => Value::Int(x.checked_pow(u32::try_from(y).ok()?)?),
            _ => Value::Float(a.as_f64().powf(b.as_f64())),
        },
    })
}

/// Python's `//` on ints: rounds toward negative infinity.
fn floor_div(x: i64, y: i64) -> Option<i64> {
    let q = x.checked_div(y)?;
    Some(if (x % y != 0) && ((x < 0) != (y < 0)) {
        q - 1
    } else {
        q
    })
}

fn many(op: Many, a: Value, b: Value) -> Option<Value> {
    let ints = a.as_int().zip(b.as_int());
    Some(match op {
        Many::And => Value::Bool(a.truth() && b.truth()),
        Many::Or => Value::Bool(a.truth() || b.truth()),
        Many::Add => match ints {
            Some((x, y)) => Value::Int(x.checked_add(y)?),
            None => Value::Float(a.as_f64() + b.as_f64()),
        },
        Many::Mul => match ints {
            Some((x, y)) => Value::Int(x.checked_mul(y)?),
            None => Value::Float(a.as_f64() * b.as_f64()),
        },
        Many::Max | Many::Min => {
            let a_first = match ints {
                Some((x, y)) => (x >= y) == (op == Many::Max),
                None => (a.as_f64() >= b.as_f64()) == (op == Many::Max),
            };
            if a_first {
                a
            } else {
                b
            }
        }
    })
}

/// Which value of a tensor a shape guard reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorProperty {
    Size,
    Stride,
    /// The input is an int or float argument: its value.
    Value,
}

/// The symbolic-shape part of one cache entry's guard: the values to read (the `input`-th
/// tensor with symbolic sizes, a property, a dimension) and expressions over them that must
/// all hold, each with a description for recompile messages.
#[derive(Clone, Debug, Default)]
pub struct ShapePlan {
    pub reads: Vec<(usize, TensorProperty, usize)>,
    pub checks: Vec<(ShapeExpr, String)>,
}

impl ShapePlan {
    /// The description of the first check that does not hold for `values`, if any.
    pub fn first_failure(&self, values: &[Value]) -> Option<&str> {
        self.checks
            .iter()
            .find(|(expr, _)| !expr.holds(values))
            .map(|(_, what)| what.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Vec<Value> {
        values.iter().map(|&v| Value::Int(v)).collect()
    }

    fn read(i: usize) -> Box<ShapeExpr> {
        Box::new(ShapeExpr::Read(i))
    }

    fn int(v: i64) -> Box<ShapeExpr> {
        Box::new(ShapeExpr::Const(Value::Int(v)))
    }

    #[test]
    fn python_floor_division_and_modulo() {
        for (x, y) in [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (6, 3)] {
            let div = ShapeExpr::Binary(Binary::FloorDiv, int(x), int(y));
            let rem = ShapeExpr::Binary(Binary::Mod, int(x), int(y));
            let (q, r) = (div.eval(&[]), rem.eval(&[]));
            let expect_q = (x as f64 / y as f64).floor() as i64;
            assert_eq!(q, Some(Value::Int(expect_q)), "{x} // {y}");
            assert_eq!(r, Some(Value::Int(x - expect_q * y)), "{x} % {y}");
        }
    }

    #[test]
    fn float_reads() {
        // A float argument read as a value: 2.0 * f > 1.0 (a SymFloat's guard).
        let expr = ShapeExpr::Binary(
            Binary::Gt,
            Box::new(ShapeExpr::Many(
                Many::Mul,
                vec![ShapeExpr::Const(Value::Float(2.0)), *read(0)],
            )),
            Box::new(ShapeExpr::Const(Value::Float(1.0))),
        );
        assert!(expr.holds(&[Value::Float(0.75)]));
        assert!(!expr.holds(&[Value::Float(0.25)]));
    }

    #[test]
    fn the_seed_guard() {
        // 2 * s0 < 16 with s0 read at index 0.
        let expr = ShapeExpr::Binary(
            Binary::Lt,
            Box::new(ShapeExpr::Many(Many::Mul, vec![*int(2), *read(0)])),
            int(16),
        );
        assert!(expr.holds(&ints(&[7])));
        assert!(!expr.holds(&ints(&[8])));
        assert!(!expr.holds(&[]), "a missing read does not hold");
    }

    #[test]
    fn failures_never_hold() {
        let zero_div = ShapeExpr::Binary(Binary::FloorDiv, read(0), int(0));
        assert!(!ShapeExpr::Binary(Binary::Ge, Box::new(zero_div), int(0)).holds(&ints(&[4])));
        let overflow = ShapeExpr::Many(Many::Mul, vec![*read(0), *read(0)]);
        assert_eq!(overflow.eval(&ints(&[i64::MAX])), None);
        let pow = ShapeExpr::Binary(Binary::Pow, read(0), int(70));
        assert_eq!(pow.eval(&ints(&[2])), None);
    }

    #[test]
    fn floats_and_logic() {
        let half = ShapeExpr::Binary(Binary::TrueDiv, read(0), int(2));
        assert_eq!(half.eval(&ints(&[5])), Some(Value::Float(2.5)));
        let ceil = ShapeExpr::Unary(Unary::Ceil, Box::new(half.clone()));
        assert_eq!(ceil.eval(&ints(&[5])), Some(Value::Int(3)));
        let both = ShapeExpr::Many(
            Many::And,
            vec![
                ShapeExpr::Binary(Binary::Ge, read(0), int(2)),
                ShapeExpr::Unary(
                    Unary::Not,
                    Box::new(ShapeExpr::Binary(Binary::Eq, read(0), read(1))),
                ),
            ],
        );
        assert!(both.holds(&ints(&[3, 4])));
        assert!(!both.holds(&ints(&[3, 3])));
        assert!(!both.holds(&ints(&[1, 4])));
        let max = ShapeExpr::Many(Many::Max, vec![*read(0), *read(1), *int(5)]);
        assert_eq!(max.eval(&ints(&[3, 9])), Some(Value::Int(9)));
        assert_eq!(max.max_read(), Some(1));
    }

    #[test]
    fn plan_names_the_first_failing_check() {
        let plan = ShapePlan {
            reads: vec![(0, TensorProperty::Size, 0), (1, TensorProperty::Size, 0)],
            checks: vec![
                (
                    ShapeExpr::Binary(Binary::Ge, read(0), int(2)),
                    "x.size()[0] >= 2".into(),
                ),
                (
                    ShapeExpr::Binary(Binary::Eq, read(1), read(0)),
                    "y.size()[0] == x.size()[0]".into(),
                ),
            ],
        };
        assert_eq!(plan.first_failure(&ints(&[4, 4])), None);
        assert_eq!(plan.first_failure(&ints(&[1, 1])), Some("x.size()[0] >= 2"));
        assert_eq!(
            plan.first_failure(&ints(&[4, 5])),
            Some("y.size()[0] == x.size()[0]")
        );
    }
}
