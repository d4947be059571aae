from retention_client.main import main

raise SystemExit(main())
