fn main() {
    hillside::main();
}
