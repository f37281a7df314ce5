module boxhost/boxd

go 1.19
