pub mod bytecode;
pub mod shapes;
