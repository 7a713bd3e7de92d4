pub mod bytecode;
pub mod files;
pub mod shapes;
