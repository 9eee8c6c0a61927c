"""The task store: creation (`create`), the transaction writer (`writer`), reads (`queries`),
client control (`control`) and REST/Kafka submissions (`submission`)."""
